"""``subscribe`` cannot make the hub hold unbounded memory (issue 21, item 5).

Each event type a client subscribes to is kept with its connection. Before
the bound one anonymous connection grew the hub by 8–12 MiB per call with
4,000 event names of 2 KB, linearly. Now a connection holds at most
``--max-subscriptions-per-client`` names of at most ``--max-event-type-length``
characters each; a call that would pass either is refused whole with a
message naming the limit, and what a connection held goes with it.

The attackers are real hypha-rpc clients: an anonymous outsider in a
workspace of its own, and a member of the victim's workspace holding a read
token. The count the hub holds is read from its connections themselves.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypha_rpc.rpc import RemoteException

from switchboard.config import Settings
from switchboard.testing.hub import RunningServer
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(90)

# The defaults (read this way so the file also runs, and fails, on code from before the bound).
MAX_NAMES = getattr(Settings(), "max_subscriptions_per_client", 1000)
MAX_LENGTH = getattr(Settings(), "max_event_type_length", 256)


def held(server: RunningServer, client: Any) -> set[str]:
    """The event names the hub holds for ``client``'s connection."""
    peer = server.hub.peers[f"{client.config['workspace']}/{client.config['client_id']}"]
    return set(server.hub.subscribers.names_of(peer))


def held_everywhere(server: RunningServer) -> tuple[int, int]:
    """Names and characters of names held for every connection of the hub."""
    names = [n for peer in server.hub.peers.values() for n in server.hub.subscribers.names_of(peer)]
    return len(names), sum(map(len, names))


async def attackers(connect: Any) -> list[Any]:
    """An anonymous outsider, and a member of the owner's workspace with a read token."""
    owner = await connect(client_id="owner")
    read = await owner.generate_token({"permission": "read"})
    outsider = await connect(client_id="outsider")
    member = await connect(client_id="reader", token=read)
    assert member.config["workspace"] == owner.config["workspace"] != outsider.config["workspace"]
    return [outsider, member]


async def test_the_issues_call_4000_names_of_2_kb_is_refused_and_leaves_nothing_held(
    server: RunningServer, connect: Any
) -> None:
    for attacker in await attackers(connect):
        before, everywhere = set(held(server, attacker)), held_everywhere(server)
        names = [f"e{i:04d}-" + "x" * 2042 for i in range(4000)]
        with pytest.raises(RemoteException, match=f"at most {MAX_LENGTH} characters") as refused:
            await attacker.subscribe(names)
        assert "--max-event-type-length" in str(refused.value)
        assert held(server, attacker) == before  # what hypha-rpc subscribed to itself, nothing more
        assert held_everywhere(server) == everywhere
        assert (await attacker.check_status())["status"] == "ready"  # and the connection still works


async def test_past_the_count_bound_a_call_is_refused_whole_naming_the_limit(
    server: RunningServer, connect: Any
) -> None:
    for attacker in await attackers(connect):
        tag = attacker.config["client_id"]
        batch = 250
        refusals, refusal = 0, ""
        for start in range(0, 4 * MAX_NAMES, batch):  # bounded: four times the limit at most
            names = [f"{tag}-{i}-" + "y" * (MAX_LENGTH - 20) for i in range(start, start + batch)]
            try:
                await attacker.subscribe(names)
            except RemoteException as exc:
                refusals += 1
                refusal = str(exc)
            assert len(held(server, attacker)) <= MAX_NAMES
        assert refusals >= 3 * MAX_NAMES // batch
        assert f"at most {MAX_NAMES} event types" in refusal
        assert "--max-subscriptions-per-client" in refusal
        assert MAX_NAMES - batch < len(held(server, attacker)) <= MAX_NAMES
        # One call larger than the bound is refused whole, not half applied.
        await attacker.unsubscribe(sorted(held(server, attacker)))
        assert held(server, attacker) == set()
        with pytest.raises(RemoteException, match=f"at most {MAX_NAMES} event types"):
            await attacker.subscribe([f"{tag}-many-{i}" for i in range(MAX_NAMES + 1)])
        assert held(server, attacker) == set()
        # Names already held do not count twice.
        names = [f"{tag}-again-{i}" for i in range(MAX_NAMES)]
        assert await attacker.subscribe(names) is True
        assert await attacker.subscribe(names[:10]) is True
        assert len(held(server, attacker)) == MAX_NAMES
    count, chars = held_everywhere(server)  # the hub's memory for names: bounded by its connections
    connections = len(server.hub.peers)
    assert count <= connections * MAX_NAMES
    assert chars <= connections * MAX_NAMES * MAX_LENGTH


async def test_one_name_over_the_length_bound_is_refused(server: RunningServer, connect: Any) -> None:
    for attacker in await attackers(connect):
        before = set(held(server, attacker))
        assert await attacker.subscribe("a" * MAX_LENGTH) is True
        with pytest.raises(RemoteException, match=f"at most {MAX_LENGTH} characters"):
            await attacker.subscribe("b" * (MAX_LENGTH + 1))
        with pytest.raises(RemoteException, match=f"at most {MAX_LENGTH} characters"):
            await attacker.subscribe(["ok-name", "c" * (MAX_LENGTH + 1)])
        assert held(server, attacker) == before | {"a" * MAX_LENGTH}


async def test_other_clients_are_unaffected_and_what_a_connection_held_is_freed_when_it_leaves(
    server: RunningServer, connect: Any
) -> None:
    owner = await connect(client_id="owner")
    token = await owner.generate_token()
    listener = await connect(client_id="listener", token=token)
    got: list[Any] = []
    listener.on("my-event", got.append)
    assert await listener.subscribe("my-event") is True
    attacker = await connect(client_id="attacker")
    peer = server.hub.peers[f"{attacker.config['workspace']}/attacker"]
    names = server.hub.subscribers.names_of
    assert await attacker.subscribe([f"n{i}" for i in range(MAX_NAMES - len(names(peer)))]) is True
    with pytest.raises(RemoteException, match="at most"):
        await attacker.subscribe("one-more")
    # Someone else's bound is their own: the listener subscribes and hears a broadcast.
    assert await listener.subscribe([f"mine-{i}" for i in range(10)]) is True
    await owner.emit({"type": "my-event", "to": "*", "data": {"n": 1}})
    await eventually(lambda: got, what="the listener's event")
    assert len(names(peer)) == MAX_NAMES
    with contextlib.suppress(Exception):
        await attacker.disconnect()
    await eventually(lambda: peer.closed and not names(peer), what="the attacker's names freed")
    kept = [*held(server, owner), *held(server, listener)]
    assert held_everywhere(server) == (len(kept), sum(map(len, kept)))
