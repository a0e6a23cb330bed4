"""Users, permissions and tokens (protocol §6.3, §6.4), with time from a fake clock."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import jwt
import pytest

from switchboard.backends.revocations import MemoryRevocations
from switchboard.errors import AuthError, ProtocolError
from switchboard.hub.identity.auth import (
    AUDIENCE,
    CREDENTIAL_EXPIRY,
    ISSUER,
    MAX_EXTRA_SCOPES,
    TokenIssuer,
    child_user,
    parse_scope,
)
from switchboard.hub.identity.credentials import Credentials
from switchboard.hub.identity.users import ROOT, Permission, User, new_anonymous_user, user_workspace
from switchboard.hub.identity.verified_tokens import VerifiedTokens
from switchboard.testing.clock import FakeClock

SECRET = "test-secret-please-ignore-0123456789"
OTHER_SECRET = "another-secret-entirely-9876543210"

# Any fake "now" works, since verify() consults only the injected clock; a far
# future one makes that visible (the system clock would call such tokens valid
# long after the fake clock expires them).
FUTURE = 4_000_000_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(wall=FUTURE)


@pytest.fixture
def issuer(clock: FakeClock) -> TokenIssuer:
    return TokenIssuer(SECRET, clock)


ALICE = User(
    id="alice",
    roles=("user",),
    grants={"ws-shared": Permission.READ, "ws-team": Permission.ADMIN},
    email="alice@example.org",
)


def claims_of(token: str) -> dict[str, Any]:
    return jwt.decode(token, options={"verify_signature": False})


def b64(data: dict[str, Any]) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# -- permissions -------------------------------------------------------------


class TestPermission:
    def test_ordering(self) -> None:
        assert Permission.NONE < Permission.READ < Permission.READ_WRITE < Permission.ADMIN

    @pytest.mark.parametrize(
        ("text", "perm"),
        [
            ("r", Permission.READ),
            ("read", Permission.READ),
            ("rw", Permission.READ_WRITE),
            ("read_write", Permission.READ_WRITE),
            ("a", Permission.ADMIN),
            ("admin", Permission.ADMIN),
        ],
    )
    def test_parse(self, text: str, perm: Permission) -> None:
        assert Permission.parse(text) is perm

    @pytest.mark.parametrize("text", ["", "x", "write", "ADMIN", "n"])
    def test_parse_unknown(self, text: str) -> None:
        with pytest.raises(ValueError, match="unknown permission"):
            Permission.parse(text)

    @pytest.mark.parametrize(
        ("perm", "code"),
        [
            (Permission.NONE, ""),
            (Permission.READ, "r"),
            (Permission.READ_WRITE, "rw"),
            (Permission.ADMIN, "a"),
        ],
    )
    def test_code_round_trips(self, perm: Permission, code: str) -> None:
        assert perm.code == code
        if code:
            assert Permission.parse(code) is perm


class TestUserPermission:
    def test_own_workspace_is_admin(self) -> None:
        user = User(id="bob")

        assert user_workspace("bob") == "ws-user-bob"
        assert user.permission("ws-user-bob") is Permission.ADMIN

    def test_another_users_workspace_is_nothing(self) -> None:
        assert User(id="bob").permission("ws-user-alice") is Permission.NONE

    def test_specific_grant(self) -> None:
        assert ALICE.permission("ws-shared") is Permission.READ
        assert ALICE.permission("ws-team") is Permission.ADMIN
        assert ALICE.permission("ws-other") is Permission.NONE

    def test_star_grant_applies_everywhere(self) -> None:
        user = User(id="bob", grants={"*": Permission.READ})

        assert user.permission("anything") is Permission.READ

    @pytest.mark.parametrize(
        ("grants", "expected"),
        [
            ({"*": Permission.READ, "w": Permission.ADMIN}, Permission.ADMIN),
            ({"*": Permission.ADMIN, "w": Permission.READ}, Permission.ADMIN),
            ({"*": Permission.READ_WRITE}, Permission.READ_WRITE),
            ({"w": Permission.READ}, Permission.READ),
        ],
    )
    def test_stronger_of_star_and_specific(self, grants: dict[str, Permission], expected: Permission) -> None:
        assert User(id="bob", grants=grants).permission("w") is expected

    def test_admin_role_is_admin_everywhere(self) -> None:
        user = User(id="boss", roles=("admin",))

        assert user.permission("public") is Permission.ADMIN
        assert user.permission("ws-user-someone") is Permission.ADMIN
        assert ROOT.permission("anything") is Permission.ADMIN

    def test_can(self) -> None:
        assert ALICE.can("ws-shared", Permission.READ)
        assert not ALICE.can("ws-shared", Permission.READ_WRITE)
        assert ALICE.can("ws-team", Permission.READ_WRITE)
        assert ALICE.can("ws-other", Permission.NONE)
        assert not ALICE.can("ws-other", Permission.READ)

    def test_anonymous_user(self) -> None:
        anon = new_anonymous_user()

        assert anon.id.startswith("anonymouz-")
        assert anon.is_anonymous
        assert anon.permission(user_workspace(anon.id)) is Permission.ADMIN
        assert anon.permission("public") is Permission.NONE
        assert new_anonymous_user().id != anon.id

    def test_wire_shape(self) -> None:
        wire = ALICE.to_wire("ws-team", "cA")

        assert wire["id"] == "alice"
        assert wire["is_anonymous"] is False
        assert wire["current_workspace"] == "ws-team"
        assert wire["scope"]["current_workspace"] == "ws-team"
        assert wire["scope"]["client_id"] == "cA"
        assert wire["scope"]["workspaces"] == {
            "ws-shared": "r",
            "ws-team": "a",
            "ws-user-alice": "a",
        }


class TestChildUser:
    def test_inherits_roles_and_sets_parent(self) -> None:
        child = child_user(ALICE, workspace="ws-team", permission=Permission.READ_WRITE)

        assert child.id != ALICE.id
        assert child.roles == ALICE.roles
        assert child.parent == "alice"
        assert child.email == ALICE.email
        assert child.grants == {"ws-team": Permission.READ_WRITE}

    def test_grandchild_keeps_the_original_parent(self) -> None:
        child = child_user(ALICE, workspace="ws-team", permission=Permission.ADMIN)
        grandchild = child_user(child, workspace="ws-team", permission=Permission.READ)

        assert grandchild.parent == "alice"

    def test_a_child_of_a_hub_admin_holds_its_grant_and_not_the_admin_role(self) -> None:
        child = child_user(ROOT, workspace="w", permission=Permission.READ)

        assert child.roles == ()
        assert child.permission("w") is Permission.READ
        assert child.permission("elsewhere") is Permission.NONE

    def test_each_child_is_new(self) -> None:
        a = child_user(ALICE, workspace="w", permission=Permission.READ)
        b = child_user(ALICE, workspace="w", permission=Permission.READ)

        assert a.id != b.id


# -- tokens ------------------------------------------------------------------------


class TestRoundTrip:
    def test_keeps_identity_grants_cid_and_wid(self, issuer: TokenIssuer) -> None:
        token = issuer.issue(
            ALICE,
            workspace="ws-work",
            permission=Permission.READ_WRITE,
            expires_in=3600,
            client_id="cA",
        )
        user = issuer.verify(token)

        assert user.id == "alice"
        assert user.roles == ("user",)
        assert user.email == "alice@example.org"
        assert user.parent is None
        assert user.grants == {
            "ws-shared": Permission.READ,
            "ws-team": Permission.ADMIN,
            "ws-work": Permission.READ_WRITE,
        }
        assert user.client_id == "cA"
        assert user.current_workspace == "ws-work"
        assert user.expires_at == FUTURE + 3600

    def test_without_client_id(self, issuer: TokenIssuer) -> None:
        token = issuer.issue(ALICE, workspace="ws-work", permission=Permission.READ, expires_in=60)

        assert issuer.verify(token).client_id is None

    def test_permission_for_the_token_workspace_wins(self, issuer: TokenIssuer) -> None:
        token = issuer.issue(ALICE, workspace="ws-team", permission=Permission.READ, expires_in=60)

        assert issuer.verify(token).grants["ws-team"] is Permission.READ

    def test_star_grant_and_admin_role(self, issuer: TokenIssuer) -> None:
        user = issuer.verify(issuer.issue(ROOT, workspace="public", permission=Permission.ADMIN, expires_in=60))

        assert user.grants["*"] is Permission.ADMIN
        assert user.roles == ("admin",)
        assert user.permission("anything") is Permission.ADMIN

    def test_child_token_keeps_parent(self, issuer: TokenIssuer) -> None:
        child = child_user(ALICE, workspace="ws-team", permission=Permission.READ)
        user = issuer.verify(issuer.issue(child, workspace="ws-team", permission=Permission.READ, expires_in=60))

        assert user.id == child.id
        assert user.parent == "alice"
        assert user.roles == ("user",)

    def test_claims_follow_the_reference_layout(self, issuer: TokenIssuer) -> None:
        token = issuer.issue(ALICE, workspace="ws-work", permission=Permission.ADMIN, expires_in=100, client_id="cA")
        claims = claims_of(token)

        assert jwt.get_unverified_header(token)["alg"] == "HS256"
        assert claims["sub"] == "alice"
        assert claims["iss"] == ISSUER
        assert claims["aud"] == AUDIENCE
        assert claims["iat"] == int(FUTURE)
        assert claims["exp"] == int(FUTURE) + 100
        assert claims["gty"] == "client-credentials"
        assert claims["https://amun.ai/roles"] == ["user"]
        scope = claims["scope"].split()
        assert "ws:ws-work#a" in scope
        assert "cid:cA" in scope
        assert scope[-1] == "wid:ws-work"

    def test_another_replica_with_the_same_secret_accepts(self, issuer: TokenIssuer, clock: FakeClock) -> None:
        token = issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=60)

        assert TokenIssuer(SECRET, clock).verify(token).id == "alice"

    def test_verify_uses_only_the_injected_clock(self) -> None:
        past = TokenIssuer(SECRET, FakeClock(wall=1_700_000_000.0))
        token = past.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=3600)

        assert past.verify(token).id == "alice"


class TestExpiry:
    def test_valid_until_just_before_exp(self, issuer: TokenIssuer, clock: FakeClock) -> None:
        token = issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=60)
        clock.advance(59.5)

        assert issuer.verify(token).id == "alice"

    @pytest.mark.parametrize("later", [60.0, 61.0, 86_400.0])
    def test_rejected_once_expired(self, issuer: TokenIssuer, clock: FakeClock, later: float) -> None:
        token = issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=60)
        clock.advance(later)

        with pytest.raises(AuthError, match="expired"):
            issuer.verify(token)

    def test_zero_lifetime_is_already_expired(self, issuer: TokenIssuer) -> None:
        token = issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=0)

        with pytest.raises(AuthError, match="expired"):
            issuer.verify(token)


class TestRejected:
    def token(self, issuer: TokenIssuer) -> str:
        return issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=3600)

    def test_forged_payload(self, issuer: TokenIssuer) -> None:
        header, _, signature = self.token(issuer).split(".")
        forged = {**claims_of(self.token(issuer)), "scope": "ws:*#a wid:w", "sub": "root"}

        with pytest.raises(AuthError, match="invalid token"):
            issuer.verify(f"{header}.{b64(forged)}.{signature}")

    def test_flipped_character_in_payload(self, issuer: TokenIssuer) -> None:
        header, payload, signature = self.token(issuer).split(".")
        middle = len(payload) // 2
        flipped = "A" if payload[middle] != "A" else "B"
        payload = payload[:middle] + flipped + payload[middle + 1 :]

        with pytest.raises(AuthError, match="invalid token"):
            issuer.verify(f"{header}.{payload}.{signature}")

    def test_flipped_character_in_signature(self, issuer: TokenIssuer) -> None:
        header, payload, signature = self.token(issuer).split(".")
        flipped = "A" if signature[0] != "A" else "B"

        with pytest.raises(AuthError, match="invalid token"):
            issuer.verify(f"{header}.{payload}.{flipped}{signature[1:]}")

    def test_signed_with_another_secret(self, issuer: TokenIssuer, clock: FakeClock) -> None:
        token = TokenIssuer(OTHER_SECRET, clock).issue(
            ALICE, workspace="w", permission=Permission.READ, expires_in=3600
        )

        with pytest.raises(AuthError, match="invalid token"):
            issuer.verify(token)

    def test_unsigned_token(self, issuer: TokenIssuer) -> None:
        token = jwt.encode(claims_of(self.token(issuer)), None, algorithm="none")

        with pytest.raises(AuthError, match="invalid token"):
            issuer.verify(token)

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            pytest.param({"aud": "someone-else"}, "invalid token", id="audience"),
            pytest.param({"iss": "https://amun.ai/"}, "invalid token", id="issuer"),
            pytest.param({"exp": None}, "invalid token", id="no-exp"),
            pytest.param({"sub": None}, "invalid token", id="no-sub"),
            pytest.param({"scope": "ws:w#superuser"}, "bad scope entry", id="bad-perm"),
            pytest.param({"https://amun.ai/roles": "admin"}, "roles must be a list", id="roles-str"),
            pytest.param({"https://amun.ai/roles": [1]}, "roles must be a list", id="roles-int"),
        ],
    )
    def test_bad_claims_signed_with_the_right_secret(
        self, issuer: TokenIssuer, change: dict[str, Any], message: str
    ) -> None:
        claims = {**claims_of(self.token(issuer)), **change}
        claims = {k: v for k, v in claims.items() if v is not None}
        token = jwt.encode(claims, SECRET, algorithm="HS256")

        with pytest.raises(AuthError, match=message):
            issuer.verify(token)

    @pytest.mark.parametrize("token", ["", "abc", "a.b", "a.b.c.d", None, 42])
    def test_not_a_jwt(self, issuer: TokenIssuer, token: Any) -> None:
        with pytest.raises(AuthError):
            issuer.verify(token)


class TestScopeIsBuiltFromCheckedValues:
    """A scope is split on spaces and '#' when read: no value may carry either in."""

    @pytest.mark.parametrize(
        "field", [{"client_id": "x ws:*#a"}, {"workspace": "w ws:*#a"}, {"client_id": "x#a"}, {"workspace": "*"}]
    )
    def test_a_value_outside_the_id_grammar_is_refused(self, issuer: TokenIssuer, field: dict) -> None:
        args = {"workspace": "ws-team", "client_id": None, **field}
        with pytest.raises(ProtocolError, match="invalid"):
            issuer.issue(ALICE, permission=Permission.READ, expires_in=60, **args)

    @pytest.mark.parametrize(
        "scope",
        [
            "ws:*#a ws:w#r wid:w x!",
            "ws:w#r wid:w cid:",
            "ws:w#r wid:w ws:v",
            "ws:w#r wid:w wid:",
            "wid:w a:b a:b",
            "ws:w#r  wid:w",
            "ws:w x#a wid:w",
            "cid:a cid:b wid:w",
            "ws:w#r wid:w wid:v",
            "ws:#a wid:w",
            "cid:a:b wid:w",
            "ws:w w#a wid:w",
        ],
    )
    def test_a_scope_with_anything_unexpected_is_refused(self, scope: str) -> None:
        with pytest.raises(AuthError, match="bad scope entry"):
            parse_scope(scope)

    def test_extra_scopes_read_back_as_labels_never_as_grants(self, issuer: TokenIssuer) -> None:
        user = dataclasses.replace(ALICE, extra_scopes=("read:data", "quota.gold"))
        token = issuer.issue(user, workspace="ws-work", permission=Permission.READ, expires_in=60)
        back = issuer.verify(token)
        assert back.extra_scopes == ("read:data", "quota.gold")
        assert back.grants == {**ALICE.grants, "ws-work": Permission.READ}
        assert parse_scope("wid:w a:b c.d").extra_scopes == ("a:b", "c.d")

    @pytest.mark.parametrize("extra", ["ws:w#a", "cid:x", "wid:v", "a b", "a#b", "x" * 129, ""])
    def test_an_extra_scope_outside_its_grammar_is_refused_when_issued(self, issuer: TokenIssuer, extra: str) -> None:
        user = dataclasses.replace(ALICE, extra_scopes=(extra,))
        with pytest.raises(AuthError, match="invalid extra scope"):
            issuer.issue(user, workspace="ws-work", permission=Permission.READ, expires_in=60)

    def test_too_many_extra_scopes_are_refused(self) -> None:
        many = " ".join(f"s{i}" for i in range(MAX_EXTRA_SCOPES + 1))
        with pytest.raises(AuthError, match="bad scope entry"):
            parse_scope(f"wid:w {many}")

    def test_the_scope_reads_back_what_was_granted(self, issuer: TokenIssuer) -> None:
        token = issuer.issue(ALICE, workspace="ws-work", permission=Permission.READ, expires_in=60, client_id="cA")

        user = issuer.verify(token)

        assert user.grants == {**ALICE.grants, "ws-work": Permission.READ}
        assert (user.client_id, user.current_workspace) == ("cA", "ws-work")


# -- a reconnection token expires with the credential it descends from (issue 21, item 4) ----------

TWO_DAYS = 172800.0


def test_a_reconnection_token_expires_no_later_than_its_credential(issuer: TokenIssuer, clock: FakeClock) -> None:
    credential = issuer.issue(ALICE, workspace="ws-team", permission=Permission.ADMIN, expires_in=10)
    holder = issuer.verify(credential)
    resume = issuer.issue(holder, workspace="ws-team", permission=Permission.ADMIN, expires_in=TWO_DAYS, resumes=True)
    assert claims_of(resume)["exp"] == int(FUTURE + 10)
    clock.advance(6)
    resumed = issuer.verify(resume)  # a refresh, on any replica: the bound travels in the token
    refreshed = issuer.issue(
        resumed, workspace="ws-team", permission=Permission.ADMIN, expires_in=TWO_DAYS, resumes=True
    )
    assert claims_of(refreshed)["exp"] == int(FUTURE + 10)
    clock.advance(5)
    for token in (resume, refreshed):
        with pytest.raises(AuthError, match="token has expired"):
            issuer.verify(token)


def test_an_anonymous_users_reconnection_token_keeps_the_configured_lifetime(
    issuer: TokenIssuer, clock: FakeClock
) -> None:
    guest = new_anonymous_user()
    ws = user_workspace(guest.id)
    resume = issuer.issue(guest, workspace=ws, permission=Permission.ADMIN, expires_in=TWO_DAYS, resumes=True)
    clock.advance(TWO_DAYS - 1)
    renewed = issuer.issue(
        issuer.verify(resume), workspace=ws, permission=Permission.ADMIN, expires_in=TWO_DAYS, resumes=True
    )
    assert claims_of(renewed)["exp"] == int(FUTURE + 2 * TWO_DAYS - 1)


def test_only_an_anonymous_user_resumes_without_a_credential(issuer: TokenIssuer) -> None:
    resume = issuer.issue(ALICE, workspace="ws-team", permission=Permission.ADMIN, expires_in=60, resumes=True)
    body = {**claims_of(resume), CREDENTIAL_EXPIRY: None}
    with pytest.raises(AuthError, match="bad credential expiry"):
        issuer.verify(jwt.encode(body, SECRET, algorithm="HS256"))


class TestVerifiedTokens:
    """Clients sharing one token cost one check of it; what can change is still checked on every use."""

    @pytest.fixture
    def decodes(self, monkeypatch: pytest.MonkeyPatch) -> list[str]:
        """Every token PyJWT is asked to verify (the real decode runs)."""
        seen: list[str] = []
        real = jwt.decode

        def counting(token: str, *args: Any, **kwargs: Any) -> Any:
            seen.append(token)
            return real(token, *args, **kwargs)

        monkeypatch.setattr(jwt, "decode", counting)
        return seen

    def test_a_token_checked_once_is_not_decoded_again(self, issuer: TokenIssuer, decodes: list[str]) -> None:
        token = issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=60)

        users = [issuer.verify(token) for _ in range(50)]

        assert decodes == [token]
        assert {u.id for u in users} == {"alice"}

    def test_a_remembered_token_still_expires(self, issuer: TokenIssuer, clock: FakeClock) -> None:
        token = issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=60)
        issuer.verify(token)
        clock.advance(60)

        with pytest.raises(AuthError, match="expired"):
            issuer.verify(token)

    def test_a_token_one_byte_off_is_checked_afresh(self, issuer: TokenIssuer) -> None:
        token = issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=60)
        issuer.verify(token)
        head, payload, signature = token.split(".")
        forged = ".".join([head, payload, ("A" if signature[0] != "A" else "B") + signature[1:]])

        with pytest.raises(AuthError, match="invalid token"):
            issuer.verify(forged)

    def test_only_tokens_that_passed_are_kept(self, issuer: TokenIssuer, clock: FakeClock) -> None:
        expired = issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=0)
        foreign = TokenIssuer(OTHER_SECRET, clock).issue(
            ALICE, workspace="w", permission=Permission.READ, expires_in=60
        )
        for token in (expired, foreign, "a.b.c"):
            with pytest.raises(AuthError):
                issuer.verify(token)

        assert len(issuer.verified) == 0

    def test_the_memory_is_bounded_and_keeps_the_tokens_in_use(self, clock: FakeClock) -> None:
        issuer = TokenIssuer(SECRET, clock, VerifiedTokens(size=3))
        tokens = [issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=60 + i) for i in range(4)]
        for token in tokens[:3]:
            issuer.verify(token)
        issuer.verify(tokens[0])  # in use again: the oldest now is tokens[1]
        issuer.verify(tokens[3])

        assert len(issuer.verified) == 3
        assert tokens[0] in issuer.verified
        assert tokens[1] not in issuer.verified

    async def test_a_remembered_token_is_refused_once_revoked(self, issuer: TokenIssuer, clock: FakeClock) -> None:
        credentials = Credentials(issuer, MemoryRevocations(clock, per_principal=100, total=1_000))
        token = issuer.issue(ALICE, workspace="w", permission=Permission.READ, expires_in=600)
        assert (await credentials.verify(token)).id == "alice"

        await credentials.revoke(token, by=ALICE)

        with pytest.raises(AuthError, match="revoked"):
            await credentials.verify(token)
