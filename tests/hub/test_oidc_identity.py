"""Who a provider's user is: the subject's id, roles, admins (issue 22), decided without I/O."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchboard.config import Settings
from switchboard.errors import AuthError, ConfigError
from switchboard.hub.identity.oidc import KEYS_MAX_AGE, IdentityRules, fetch_due, subject_user_id
from switchboard.hub.identity.users import Permission, user_workspace
from switchboard.protocol.hypha import ids

ISS = "https://login.example.org/"


def _claims(sub: str = "auth0|5f3c", **more: object) -> dict[str, object]:
    return {"iss": ISS, "sub": sub, "exp": time.time() + 60, **more}


@pytest.mark.parametrize(
    "sub",
    ["auth0|5f3c1a2b3c4d5e6f7a8b9c0d", "google-oauth2|112233445566778899", "0b9d2c64-4e1c-4c1d-9d57-2b7f0a1e6f11"],
)
def test_real_subjects_are_kept_as_they_are(sub: str) -> None:
    assert subject_user_id(sub) == sub


@pytest.mark.parametrize(
    "sub",
    [
        "CgVhbGljZRIFbG9jYWw/+=",
        "a" * 65,
        "alice@example.org",
        "root",
        "anonymouz-abcdef123456",
        "sha256.abc",
        "ü",
        "op.alice",
    ],
)
def test_any_other_subject_is_hashed_into_the_grammar(sub: str) -> None:
    uid = subject_user_id(sub)
    assert uid.startswith("sha256.")
    assert ids.is_id(uid)
    assert uid == subject_user_id(sub), "not stable"


@given(st.text(min_size=1, max_size=200), st.text(min_size=1, max_size=200))
def test_two_subjects_never_share_an_id(a: str, b: str) -> None:
    if a != b:
        assert subject_user_id(a) != subject_user_id(b)
    assert ids.is_id(subject_user_id(a))


def test_a_subject_shaped_like_a_hash_cannot_take_a_hashed_subjects_id() -> None:
    hashed = subject_user_id("not an id!")
    assert subject_user_id(hashed) != hashed


def test_email_roles_and_expiry_come_from_the_claims() -> None:
    claims = _claims(email="a@example.org", email_verified=True, realm_access={"roles": ["lab", "staff"]})
    user = IdentityRules(roles_claim="realm_access.roles").user(claims)
    assert (user.id, user.email, user.roles) == ("auth0|5f3c", "a@example.org", ("lab", "staff"))
    assert user.credential_expires_at == claims["exp"], "a reconnection token could outlive the provider's token"
    assert user.can(user_workspace("auth0|5f3c"), Permission.ADMIN)
    assert not user.can("ws-user-someone-else", Permission.READ)


@pytest.mark.parametrize("verified", [None, False, "true", 1])
def test_an_email_the_provider_did_not_verify_is_not_the_users(verified: object) -> None:
    claims = _claims(email="a@example.org", email_verified=verified)
    assert IdentityRules().user(claims).email is None
    assert IdentityRules(trust_email=True).user(claims).email == "a@example.org", "a provider set as verifying"


def test_a_url_named_claim_is_read_whole() -> None:
    claims = _claims(**{"https://lab.example.org/roles": ["operator"]})
    assert IdentityRules(roles_claim="https://lab.example.org/roles").user(claims).roles == ("operator",)


def test_a_providers_admin_role_means_nothing_unless_configured() -> None:
    claims = _claims(roles=["admin", "anonymous", "lab"])
    plain = IdentityRules().user(claims)
    assert plain.roles == ("lab",)
    assert not plain.can("ws-user-other", Permission.READ)
    chosen = IdentityRules(admin_roles=frozenset({"lab"})).user(claims)
    assert chosen.can("ws-user-other", Permission.ADMIN)
    named = IdentityRules(admin_subjects=frozenset({"auth0|5f3c"})).user(_claims())
    assert named.can("ws-user-other", Permission.ADMIN)


def test_a_token_without_subject_is_refused() -> None:
    with pytest.raises(AuthError, match="no subject"):
        IdentityRules().user({"iss": ISS, "exp": time.time() + 60})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"oidc_issuer": "https://login.example.org/"}, "go together"),
        ({"oidc_audience": "hub"}, "go together"),
        ({"oidc_issuer": "login.example.org", "oidc_audience": "hub"}, "must be an http(s) URL"),
    ],
)
def test_a_provider_needs_an_issuer_url_and_an_audience(values: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.load(dict(values), environ={})


def test_keys_are_fetched_for_an_unknown_key_at_most_once_per_interval() -> None:
    due = lambda now, **kw: fetch_due(now, interval=5.0, **kw)  # noqa: E731
    assert due(0.0, known=False, fetched_at=None, tried_at=None), "the first token fetches"
    assert not due(10.0, known=True, fetched_at=8.0, tried_at=8.0), "a known key needs no fetch"
    assert not due(10.0, known=False, fetched_at=8.0, tried_at=8.0), "an unknown key within the interval: no fetch"
    assert due(13.0, known=False, fetched_at=8.0, tried_at=8.0), "an unknown key after the interval: fetch"
    assert not due(12.0, known=False, fetched_at=None, tried_at=8.0), "a failed fetch is not retried at once"
    old = 8.0 + KEYS_MAX_AGE
    assert due(old, known=True, fetched_at=8.0, tried_at=8.0), "keys an hour old are fetched again"
