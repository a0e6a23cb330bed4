"""Calls in flight to each provider (hub/routing/inflight.py, hub/routing/loads.py): what min_load decides by."""

from __future__ import annotations

from switchboard.errors import BackendError
from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.loads import REFRESH, Loads
from switchboard.testing import FakeClock

HERE = {"ws/p", "ws/q", "ws/caller"}


def test_a_call_to_a_local_provider_counts_until_its_reply() -> None:
    calls = InFlight()
    calls.opened("ws/caller", "s1", "ws/p", HERE)
    calls.opened("ws/other-replica", "s2", "ws/p", HERE)  # a caller elsewhere: counted here too
    calls.opened("ws/caller", "s3", "ws/q", HERE)
    assert (calls.load("ws/p"), calls.load("ws/q")) == (2, 1)
    calls.closed("ws/caller", "s1")
    assert calls.load("ws/p") == 1
    calls.closed("ws/caller", "s1")  # twice: nothing more
    assert calls.load("ws/p") == 1


def test_a_call_to_a_provider_of_another_replica_is_counted_there_not_here() -> None:
    calls = InFlight()
    calls.opened("ws/caller", "s1", "ws/far", HERE)
    assert calls.load("ws/far") == 0
    assert calls.loads(10) == {}


def test_a_provider_or_caller_that_leaves_takes_its_calls_with_it() -> None:
    calls = InFlight()
    calls.opened("ws/caller", "s1", "ws/p", HERE)
    calls.opened("ws/q", "s2", "ws/p", HERE)
    calls.forget_peer("ws/caller")
    assert calls.load("ws/p") == 1
    calls.forget_peer("ws/p")
    assert calls.load("ws/p") == 0
    assert calls.loads(10) == {}


def test_a_session_opened_again_is_counted_once() -> None:
    calls = InFlight()
    calls.opened("ws/caller", "s1", "ws/p", HERE)
    calls.opened("ws/caller", "s1", "ws/q", HERE)
    assert (calls.load("ws/p"), calls.load("ws/q")) == (0, 1)


def test_only_the_busiest_are_published() -> None:
    calls = InFlight()
    for n, provider in enumerate(("ws/p", "ws/q", "ws/caller")):
        for i in range(n + 1):
            calls.opened("ws/x", f"{provider}-{i}", provider, HERE)
    assert calls.loads(2) == {"ws/caller": 3, "ws/q": 2}


async def test_loads_are_exact_here_and_read_from_the_others_at_most_once_per_refresh() -> None:
    calls = InFlight()
    calls.opened("ws/caller", "s1", "ws/p", HERE)
    clock = FakeClock()
    loads = Loads(calls, clock=clock, is_local=lambda a: a in HERE)
    reads: list[int] = []

    async def remote() -> dict[str, int]:
        reads.append(1)
        return {"ws/far": 4, "ws/p": 99}  # what another replica says of a client here is ignored

    assert await loads.of(["ws/p", "ws/far"]) == {"ws/p": 1, "ws/far": 0}  # one replica: no remote
    loads.remote = remote
    assert await loads.of(["ws/p", "ws/q"]) == {"ws/p": 1, "ws/q": 0}
    assert reads == []  # every provider here: nothing read
    assert await loads.of(["ws/p", "ws/far"]) == {"ws/p": 1, "ws/far": 4}
    assert await loads.of(["ws/far"]) == {"ws/far": 4}
    assert len(reads) == 1
    clock.advance(REFRESH)
    await loads.of(["ws/far"])
    assert len(reads) == 2


async def test_an_unreadable_store_counts_the_others_as_idle() -> None:
    loads = Loads(InFlight(), clock=FakeClock(), is_local=lambda a: False)

    async def away() -> dict[str, int]:
        raise BackendError("down")

    loads.remote = away
    assert await loads.of(["ws/far"]) == {"ws/far": 0}
