"""The pending sign-ins' stores (issue 39), the embedded one and Redis, held to the same rules: an entry is
taken once, replaced only while it is there, bounded in size, and gone at its deadline; and a login key, on
the injected clock, expires after Hypha's 180 s, and a check gives up at its timeout."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.backends.logins import LOGIN_TIME, MAX_ENTRY_BYTES, MemoryLogins
from switchboard.backends.redis.stores.logins import RedisLogins
from switchboard.clock import SystemClock
from switchboard.errors import AuthError, LimitExceeded, ProtocolError
from switchboard.hub.identity.oidc_login import Flow, ProviderClient, check_nonce
from switchboard.hub.manager.login_service import LoginService
from switchboard.testing.clock import FakeClock
from switchboard.testing.wait import eventually


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return MemoryLogins(SystemClock())
    return RedisLogins(request.getfixturevalue("redis"), clock=SystemClock())


async def test_an_entry_is_taken_once_and_replaced_only_while_there(store: Any) -> None:
    await store.add("k:one", "pending", SystemClock().time() + 60)
    assert await store.get("k:one") == "pending"
    assert await store.replace("k:one", "done")
    assert await store.take("k:one") == "done"
    assert await store.take("k:one") is None
    assert not await store.replace("k:one", "forged")
    assert await store.get("k:one") is None


async def test_an_entry_is_bounded_in_size_and_gone_at_its_deadline(store: Any) -> None:
    with pytest.raises(LimitExceeded):
        await store.add("k:big", "x" * (MAX_ENTRY_BYTES + 1), SystemClock().time() + 60)
    await store.add("k:short", "pending", SystemClock().time() + 0.2)

    async def gone() -> bool:
        return await store.get("k:short") is None

    await eventually(gone, "the entry gone at its deadline", timeout=5, interval=0.05)


async def test_the_embedded_store_refuses_past_its_bound() -> None:
    store = MemoryLogins(FakeClock(), total=2)
    for name in ("a", "b"):
        await store.add(name, "", store.clock.time() + LOGIN_TIME)
    with pytest.raises(LimitExceeded, match="retry"):
        await store.add("c", "", store.clock.time() + LOGIN_TIME)


def _service(clock: FakeClock) -> LoginService:
    client = ProviderClient(
        "https://id.example", "hub", None, "https://hub.example/public/apps/hypha-login/callback", ()
    )
    return LoginService(
        MemoryLogins(clock),
        clock=clock,
        issuer=None,  # type: ignore[arg-type]  # no token is made here
        credentials=None,  # type: ignore[arg-type]
        permission=None,
        client=client,
        public_base_url="https://hub.example",
    )


async def test_a_login_key_expires_after_180_seconds() -> None:
    clock = FakeClock()
    login = _service(clock)
    ctx = await login.start()
    assert ctx["login_url"] == f"https://hub.example/public/apps/hypha-login/?key={ctx['key']}"
    clock.advance(179)  # Hypha's login time: 180 s
    assert await login.check(ctx["key"], timeout=0) is None
    clock.advance(1)
    with pytest.raises(ProtocolError, match="does not exist or expired"):
        await login.check(ctx["key"], timeout=0)
    with pytest.raises(ProtocolError, match="expired or was used"):
        await login.begin(ctx["key"])


async def test_a_check_gives_up_at_its_timeout_and_when_the_key_expires() -> None:
    clock = FakeClock()
    login = _service(clock)
    ctx = await login.start()
    with pytest.raises(ProtocolError, match="Login timeout, waited for 10 seconds"):
        await login.check(ctx["key"], timeout=10)
    assert clock.monotonic() == pytest.approx(10)
    with pytest.raises(ProtocolError, match="Login session expired"):
        await login.check(ctx["key"], timeout=LOGIN_TIME)
    assert clock.monotonic() == pytest.approx(180)
    assert login.waiting == 0


def test_pkce_s256_is_rfc_7636s_and_a_nonce_must_be_the_flows() -> None:
    flow = Flow(state="s", nonce="n-of-this-flow", verifier="dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
    assert flow.challenge == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"  # RFC 7636, appendix B
    check_nonce({"nonce": "n-of-this-flow"}, flow.nonce)
    for claims in ({}, {"nonce": "n-of-another-flow"}, {"nonce": 1}):
        with pytest.raises(AuthError, match="nonce"):
            check_nonce(claims, flow.nonce)
