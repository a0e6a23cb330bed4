"""The reconnect loop on a fake clock against a scripted endpoint: no sockets, no real waiting."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from support.stub_hub import StubHub
from switchboard.client import (
    ClientClosed,
    Disconnected,
    GaveUp,
    GivingUp,
    Reconnected,
    Reconnecting,
    ReconnectPolicy,
    Refused,
    Rejoined,
    State,
    Transport,
)
from switchboard.testing import FakeClock
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(30)

A = "ws://a.test/ws"
B = "ws://b.test/ws"
C = "ws://c.test/ws"
DEFAULTS = ReconnectPolicy()


class Recorder:
    """Connection events as they happen, and a bounded wait for the next one of a kind."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._changed = asyncio.Event()

    def __call__(self, event: Any) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait(self, kind: type | tuple[type, ...], *, after: int = 0) -> Any:
        async with asyncio.timeout(5):
            for _ in range(10_000):  # events of other kinds, within 5 s
                found = [e for e in self.events[after:] if isinstance(e, kind)]
                if found:
                    return found[0]
                self._changed.clear()
                await self._changed.wait()
        raise AssertionError(f"no {kind} event within 10,000 events")

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def hub(clock: FakeClock) -> StubHub:
    return StubHub(clock)


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


def transport(
    hub: StubHub,
    rec: Recorder,
    *,
    urls: tuple[str, ...] = (A,),
    policy: ReconnectPolicy = DEFAULTS,
    seed: int = 1,
    **kwargs: Any,
) -> Transport:
    t = Transport(
        urls,
        client_id="c1",
        policy=policy,
        clock=hub.clock,
        dial=hub.dial,
        rng=random.Random(seed),
        ping_interval=0,
        refresh_interval=0,
        **kwargs,
    )
    t.listeners.add(rec)
    return t


async def restart(hub: StubHub, url: str, *, seconds: float, code: int = 1006) -> float:
    """The server at ``url`` dies now and accepts again ``seconds`` later; returns 'now'."""
    now = hub.clock.monotonic()
    hub.down(url, until=now + seconds)
    hub.live.server_close(code)
    return now


# -- the budget ---------------------------------------------------------------------------------


async def test_survives_a_61s_restart_on_the_default_budget(hub, rec):
    """The measured restart: 61 s from kill to ready. The default policy, on purpose."""
    t = transport(hub, rec)
    await t.open()
    hub.clock.advance(3600)  # an hour of useful work first: it must not count
    killed = await restart(hub, A, seconds=61)
    outcome = await rec.wait((Reconnected, GivingUp))
    assert isinstance(outcome, Reconnected), f"gave up during a 61 s restart: {outcome.error}"
    assert t.state is State.READY
    assert 61 <= hub.clock.monotonic() - killed <= 61 + DEFAULTS.max_delay
    assert outcome.outage_seconds >= 61
    # headroom left when back: at least 150 - 61 - 10 = 79 s, more than the restart itself
    assert outcome.remaining >= 79
    await t.disconnect()


async def test_a_budget_cut_to_42_5s_gives_up_in_the_middle_of_the_restart(hub, rec):
    """12 capped exponential attempts (~42 s) die inside a 61 s restart: the failure this SDK fixes."""
    t = transport(hub, rec, policy=ReconnectPolicy(max_wait=42.5))
    lost: list[str] = []
    t.on_disconnected(lost.append)
    waiting: list[asyncio.Future[None]] = []
    # a call made during the outage waits for the connection...
    t.listeners.add(
        lambda e: (
            waiting.append(asyncio.ensure_future(t.emit_message(b"call"))) if isinstance(e, Disconnected) else None
        )
    )
    await t.open()
    killed = await restart(hub, A, seconds=61)
    gave = await rec.wait(GivingUp)
    error = gave.error
    assert isinstance(error, GaveUp)
    assert hub.clock.monotonic() - killed == pytest.approx(42.5)
    assert error.outage_seconds == pytest.approx(42.5)
    assert error.attempts == len(hub.dials) - 1
    assert "outage of 42.5 s" in str(error)
    assert f"{error.attempts} attempts" in str(error)
    # ...and gets the error, as does a new one; nothing hangs, nothing dials any more
    with pytest.raises(GaveUp):
        await waiting[0]
    with pytest.raises(GaveUp):
        await t.emit_message(b"new call")
    with pytest.raises(GaveUp):
        await t.wait_ready()
    assert lost[-1] == str(error)
    dials = len(hub.dials)
    await asyncio.sleep(0)
    assert len(hub.dials) == dials
    assert t.state is State.FAILED


async def test_the_deadline_starts_at_the_first_failure_not_at_the_drop(hub, rec):
    """A first attempt that hangs 20 s before failing does not eat into the budget."""
    slow = {"pending": True}

    async def dial(url: str) -> Any:
        if slow["pending"] and hub.sockets:
            slow["pending"] = False
            hub.clock.advance(20)
            raise TimeoutError("timed out during opening handshake")
        return await hub.dial(url)

    t = Transport(
        (A,),
        client_id="c1",
        policy=ReconnectPolicy(max_wait=30),
        clock=hub.clock,
        dial=dial,
        rng=random.Random(3),
        ping_interval=0,
        refresh_interval=0,
    )
    t.listeners.add(rec)
    await t.open()
    killed = await restart(hub, A, seconds=float("inf"))
    gave = await rec.wait(GivingUp)
    assert hub.clock.monotonic() == pytest.approx(killed + 20 + 30)
    assert gave.error.outage_seconds == pytest.approx(30)


async def test_the_first_connection_gets_the_same_budget_from_its_first_failure(hub, rec):
    hub.clock.advance(50)
    hub.down(A, until=62)
    t = transport(hub, rec, policy=ReconnectPolicy(max_wait=30))
    await t.open()
    assert t.state is State.READY
    assert hub.dials[0] == (50, A)
    assert rec.kinds()[0] == "reconnecting"  # retries are announced; the first dial is not


async def test_delays_never_exceed_max_delay_and_attempts_stay_bounded(hub, rec):
    """A 150 s outage on one URL: at most 60 attempts (ReconnectPolicy docstring), no sleep above 10 s."""
    for seed in range(20):
        clock = FakeClock()
        hub = StubHub(clock)
        rec = Recorder()
        t = transport(hub, rec, seed=seed)
        await t.open()
        await restart(hub, A, seconds=float("inf"))
        gave = await rec.wait(GivingUp)
        assert all(0 <= s <= DEFAULTS.max_delay for s in clock.sleeps)
        assert sum(clock.sleeps) == pytest.approx(150)
        assert gave.error.attempts <= 60


# -- URLs, close codes, refusals -----------------------------------------------------------------


async def test_attempts_rotate_across_urls_and_the_first_that_answers_wins(hub, rec):
    t = transport(hub, rec, urls=(A, B))
    await t.open()
    assert t.url == A
    hub.down(B, until=hub.clock.monotonic() + 20)
    await restart(hub, A, seconds=40)
    await rec.wait(Reconnected)
    urls = [url for _, url in hub.dials[1:]]
    assert urls[:4] == [B, A, B, A]  # the dropped one last
    assert t.url == B
    assert urls[-1] == B
    # one backoff per round, none between the URLs of a round
    assert len(hub.clock.sleeps) == (len(urls) - 1) // 2


@pytest.mark.parametrize("code", [1012, 1001])
async def test_a_going_away_close_moves_to_another_url_at_once(hub, rec, code):
    t = transport(hub, rec, urls=(A, B))
    await t.open()
    moved = hub.clock.monotonic()
    await restart(hub, A, seconds=float("inf"), code=code)
    back = await rec.wait(Reconnected)
    assert hub.dials[1:] == [(moved, B)]
    assert hub.clock.sleeps == []
    assert back.attempts == 1
    assert back.outage_seconds == 0


async def test_a_going_away_close_skips_the_backoff_even_while_flapping(hub, rec):
    """A rolling restart drains A, then B seconds later: each drain moves on at once."""
    t = transport(hub, rec, urls=(A, B))
    await t.open()
    await restart(hub, A, seconds=float("inf"), code=1012)
    await rec.wait(Reconnected)
    hub.clock.advance(1)
    hub.up(A)
    await restart(hub, B, seconds=float("inf"), code=1012)
    await rec.wait(Reconnected, after=len(rec.events))
    assert t.url == A
    assert hub.clock.sleeps == []


async def test_a_sibling_that_dies_soon_after_failover_moves_on_at_once(hub, rec):
    """A is killed, then B a second after we moved to it: C is healthy, so no flap penalty.

    The penalty is for a URL that drops again soon after we came back to it;
    B had not dropped before in this outage, so trying the next URL must not wait.
    """
    t = transport(hub, rec, urls=(A, B, C))
    await t.open()
    await restart(hub, A, seconds=float("inf"))
    await rec.wait(Reconnected)
    assert t.url == B
    hub.clock.advance(1)  # well inside the flap window
    killed = await restart(hub, B, seconds=float("inf"))
    await rec.wait(Reconnected, after=len(rec.events))
    assert t.url == C
    assert hub.dials[-1] == (killed, C)
    assert hub.clock.sleeps == []


async def test_a_url_that_drops_again_soon_after_we_came_back_to_it_backs_off(hub, rec):
    """A is killed, B a second later (A is back: we return at once), then A again: that is a flap."""
    t = transport(hub, rec, urls=(A, B))
    await t.open()
    await restart(hub, A, seconds=float("inf"))
    await rec.wait(Reconnected)
    hub.clock.advance(1)
    hub.up(A)
    killed = await restart(hub, B, seconds=float("inf"))
    await rec.wait(Reconnected, after=len(rec.events))
    assert hub.dials[-1] == (killed, A)
    assert hub.clock.sleeps == []
    hub.clock.advance(1)
    hub.up(B)
    killed = await restart(hub, A, seconds=float("inf"))
    await rec.wait(Reconnected, after=len(rec.events))
    assert t.url == B
    [penalty] = hub.clock.sleeps
    assert penalty > 0
    assert hub.dials[-1] == (killed + penalty, B)


async def test_an_error_frame_is_final(hub, rec):
    t = transport(hub, rec)
    await t.open()
    hub.endpoint(A).refusal = ("Authentication error: token expired", 1008)
    hub.live.server_close(1006)
    gave = await rec.wait(GivingUp)
    assert isinstance(gave.error, Refused)
    assert gave.error.close_code == 1008
    assert "token expired" in str(gave.error)
    # the refused resumption, one join with the credential (refused too), no retry
    assert len(hub.dials) == 3
    assert hub.hellos[-1][1]["reconnection_token"] is None
    with pytest.raises(Refused):
        await t.emit_message(b"x")


async def test_a_refused_reconnection_token_joins_again_as_the_same_client_with_the_credential(hub, rec):
    t = transport(hub, rec, token="the-credential")
    await t.open()
    hub.endpoint(A).refuse_resumes = ("Authentication error: invalid token: Signature verification failed", 1008)
    hub.live.server_close(1012)
    rejoined = await rec.wait(Rejoined)
    await rec.wait(Reconnected)
    assert (rejoined.client_id, rejoined.workspace, rejoined.url) == ("c1", "ws-stub", A)
    assert rejoined.reason == "Authentication error: invalid token: Signature verification failed"
    resumed, joined = hub.hellos[-2][1], hub.hellos[-1][1]
    assert resumed["reconnection_token"] == "rt-1"
    assert joined == {"client_id": "c1", "workspace": "ws-stub", "token": "the-credential", "reconnection_token": None}
    assert t.state is State.READY


async def test_a_refusal_that_is_not_about_the_token_does_not_join_again(hub, rec):
    t = transport(hub, rec)
    await t.open()
    hub.endpoint(A).refusal = ("Failed to establish connection: Permission denied for workspace: ws-stub", 1001)
    hub.live.server_close(1006)
    await rec.wait(GivingUp)
    assert len(hub.dials) == 2
    assert not [e for e in rec.events if isinstance(e, Rejoined)]


async def test_a_try_again_later_refusal_is_retried(hub, rec):
    t = transport(hub, rec)
    await t.open()
    hub.endpoint(A).refusal = ("Server is draining, please reconnect", 1013)
    hub.live.server_close(1012)
    await rec.wait(Reconnecting, after=2)
    hub.up(A)
    await rec.wait(Reconnected)
    assert t.state is State.READY


async def test_a_refusal_on_the_first_connection_is_raised(hub, rec):
    hub.endpoint(A).refusal = ("Failed to establish connection: Permission denied", 1001)
    t = transport(hub, rec)
    with pytest.raises(Refused, match="Permission denied"):
        await t.open()
    assert t.state is State.FAILED


@pytest.mark.parametrize("urls", [(A,), (A, B)])
async def test_a_server_that_accepts_then_drops_cannot_loop_forever(hub, rec, urls):
    """Connections that die within the flap window resume the outage: backoff and deadline go on.

    With several URLs too: each may flap once without a penalty, after that every flap backs off.
    """
    t = transport(hub, rec, urls=urls, policy=ReconnectPolicy(max_wait=30))

    def flap(event: Any) -> None:
        if isinstance(event, Reconnected):
            hub.clock.advance(1)
            hub.live.server_close(1006)

    t.listeners.add(flap)
    await t.open()
    hub.live.server_close(1006)
    gave = await rec.wait(GivingUp)
    assert isinstance(gave.error, GaveUp)
    assert sum(hub.clock.sleeps) <= 30


# -- identity and calls ----------------------------------------------------------------------------


async def test_reconnection_sends_the_latest_reconnection_token_and_the_same_id(hub, rec):
    t = transport(hub, rec, workspace=None, token="user-token")
    await t.open()
    assert hub.hellos[0][1] == {"client_id": "c1", "workspace": None, "token": "user-token", "reconnection_token": None}
    hub.live.push('{"type": "reconnection_token", "reconnection_token": "rt-refreshed"}')
    hub.live.server_close(1006)
    await rec.wait(Reconnected)
    assert hub.hellos[1][1] == {
        "client_id": "c1",
        "workspace": None,
        "token": "user-token",
        "reconnection_token": "rt-refreshed",
    }
    hub.live.server_close(1006)
    await rec.wait(Reconnected, after=len(rec.events))
    assert hub.hellos[2][1]["reconnection_token"] == "rt-2"  # from the last connection_info


async def test_a_drop_tells_the_rpc_to_fail_calls_in_flight_and_queues_new_ones(hub, rec):
    t = transport(hub, rec)
    lost: list[str] = []
    t.on_disconnected(lost.append)
    await t.open()
    await t.emit_message(b"before")
    first = hub.live
    await restart(hub, A, seconds=5)
    await rec.wait(Disconnected)
    assert lost == [f"{A} closed the connection (code 1006); calls in flight fail (only idempotent ones are retried)"]
    queued = asyncio.ensure_future(t.emit_message(b"during"))
    await rec.wait(Reconnected)
    await queued
    assert first.sent == [b"before"]
    assert hub.live.sent == [b"during"]


async def test_a_connection_that_dies_while_services_re_register_is_a_failed_attempt(hub, rec):
    t = transport(hub, rec)
    rounds = {"n": 0}

    async def reregister(info: dict[str, Any]) -> None:
        rounds["n"] += 1
        if rounds["n"] == 1:  # the new connection dies while services re-register
            hub.live.server_close(1006)
            await asyncio.Event().wait()  # cancelled by the transport, not left hanging

    t.on_connected(reregister)
    await t.open()
    hub.live.server_close(1006)
    back = await rec.wait(Reconnected)
    assert rounds["n"] == 2
    assert t.drops == 2
    assert back.attempts == 2
    assert rec.kinds().count("disconnected") == 2


async def test_events_and_one_log_line_per_attempt(hub, rec, caplog):
    caplog.set_level(logging.INFO, logger="switchboard.client")  # and its modules' loggers
    t = transport(hub, rec)
    await t.open()
    await restart(hub, A, seconds=3)
    back = await rec.wait(Reconnected)
    kinds = rec.kinds()
    assert kinds[0] == "disconnected"
    assert kinds[-1] == "reconnected"
    attempts = [e for e in rec.events if isinstance(e, Reconnecting)]
    assert [e.attempt for e in attempts] == list(range(1, back.attempts + 1))
    assert attempts[0].delay == 0
    assert attempts[0].error is None
    assert all(e.delay <= DEFAULTS.max_delay and e.elapsed >= 0 for e in attempts)
    lines = [r.getMessage() for r in caplog.records if r.name == "switchboard.client.transport"]
    assert sum("reconnecting to" in line for line in lines) == back.attempts
    assert any(line.startswith("client c1: reconnected to") for line in lines)


async def test_async_event_handlers_run_without_blocking_the_loop(hub, rec):
    seen: list[str] = []

    async def handler(event: Any) -> None:
        await asyncio.sleep(0)
        seen.append(event.kind)

    t = transport(hub, rec)
    t.listeners.add(handler)
    await t.open()
    hub.live.server_close(1012)
    await rec.wait(Reconnected)
    await eventually(lambda: "reconnected" in seen, timeout=5, what="the async handler", interval=0)


async def test_disconnect_during_an_outage_stops_everything(hub, rec):
    t = transport(hub, rec)
    await t.open()
    waiting: list[asyncio.Future[None]] = []
    t.listeners.add(
        lambda e: (
            waiting.append(asyncio.ensure_future(t.emit_message(b"x")))
            if isinstance(e, Reconnecting) and e.attempt == 3
            else None
        )
    )
    await restart(hub, A, seconds=float("inf"))
    await rec.wait(Reconnecting, after=3)
    await t.disconnect()
    with pytest.raises(ClientClosed):
        await waiting[0]
    dials = len(hub.dials)
    await asyncio.sleep(0)
    assert t.state is State.CLOSED
    assert len(hub.dials) == dials


async def test_keepalive_pings_and_refreshes_the_reconnection_token(hub, rec):
    hub.token_lifetime = 90.0  # refresh every 60 s (life / 1.5)
    t = Transport((A,), client_id="c1", clock=hub.clock, dial=hub.dial, ping_interval=20)
    await t.open()
    await eventually(lambda: len(hub.live.sent) >= 4, timeout=5, what="4 control frames", interval=0)
    await t.disconnect()
    assert hub.live.sent[:4] == [
        '{"type": "ping"}',
        '{"type": "ping"}',
        '{"type": "refresh_token"}',
        '{"type": "ping"}',
    ]


# -- a drain's hand-over -------------------------------------------------------------------------


async def test_a_frame_the_dying_socket_refused_unwritten_goes_out_on_the_next_connection(hub, rec):
    """The stream just ended and the reader has not seen it yet: the frame never left, so it waits."""
    from switchboard.client.errors import SocketClosed

    t = transport(hub, rec, urls=(A, B))
    await t.open()
    old = hub.live
    old.closed = SocketClosed(1006, "no close frame received", unsent=True)  # what the socket now says
    reply = asyncio.ensure_future(t.emit_message(b"reply"))
    await asyncio.sleep(0)
    assert not reply.done()
    old.server_close(1006)
    await rec.wait(Reconnected)
    await asyncio.wait_for(reply, 5)
    assert hub.live is not old
    assert hub.live.sent == [b"reply"]
    assert t.interruptions == 1  # the drop; the unwritten frame is not an interruption
    await t.disconnect()


async def test_the_hubs_restarting_notice_makes_the_end_of_the_stream_a_1012(hub, rec):
    """A draining hub sends {"type": "restarting"} and ends the stream without a close frame."""
    t = transport(hub, rec, urls=(A, B))
    await t.open()
    hub.live.push('{"type": "restarting", "code": 1012, "reason": "Server restarting, please reconnect"}')
    hub.live.server_close(1006)  # no close frame
    dropped = await rec.wait(Disconnected)
    assert dropped.code == 1012
    back = await rec.wait(Reconnected)
    assert back.url == B  # moved on to the next URL at once
    assert hub.clock.sleeps == []  # without backoff
    await t.disconnect()
