"""Which entries of this replica's clients a failover brought back although deleted
(``replicas/upkeep/stale.py``): a pure decision, driven synchronously.

Each case gives what the registry holds for the clients this replica owns, what the replica holds
itself, and what the previous look suspected; it expects what to remove now and what to suspect.
"""

from __future__ import annotations

import pytest

from switchboard.replicas.upkeep.stale import Held, Recorded, Stale, compare, field_of, stale_entries

A, B = "ws-1/a", "ws-1/b"


def rec(client: str, *services: str, in_transit: bool = False, value: str = "v") -> Recorded:
    cid = client.partition("/")[2]
    return Recorded(client, {f"{cid}:{s}": value for s in services}, in_transit=in_transit)


def live(**clients: list[str]) -> dict[str, set[str]]:
    return {f"ws-1/{cid}": {f"{cid}:{s}" for s in services} for cid, services in clients.items()}


def test_a_field_is_a_full_service_id_without_its_workspace() -> None:
    assert field_of("ws-1/a:svc") == "a:svc"


@pytest.mark.parametrize(
    ("recorded", "held", "expected"),
    [
        pytest.param([rec(A, "built-in", "x")], Held(live(a=["built-in", "x"])), [], id="all held: nothing stale"),
        pytest.param(
            [rec(A, "built-in", "x", "gone")],
            Held(live(a=["built-in", "x"])),
            [Stale(A, {"a:gone": "v"})],
            id="a live client loses the service it unregistered",
        ),
        pytest.param(
            [rec(A, "built-in", "x")],
            Held({}),
            [Stale(A, {"a:built-in": "v", "a:x": "v"}, departed=True)],
            id="a client not held here has left: every entry goes",
        ),
        pytest.param(
            [rec(A)], Held({}), [Stale(A, {}, departed=True)], id="a client without services still loses its claim"
        ),
        pytest.param([rec(A, "x")], Held({}, away={A}), [], id="in transit from here: its grace decides"),
        pytest.param(
            [rec(A, "x", in_transit=True)], Held({}), [], id="marked in transit in the registry: its grace decides"
        ),
        pytest.param(
            [rec(A, "x", in_transit=True)],
            Held(live(a=[])),
            [Stale(A, {"a:x": "v"})],
            id="a live client's transit mark keeps none of its unregistered services",
        ),
        pytest.param(
            [rec(A, "x"), rec(B, "y")],
            Held(live(b=["y"])),
            [Stale(A, {"a:x": "v"}, departed=True)],
            id="only the client that left",
        ),
        pytest.param([], Held(live(a=["x"])), [], id="a held client the registry lacks: re-assertion's job"),
        pytest.param([rec(A, "x")], Held(live(a=["x", "late"])), [], id="a service held and not recorded is not stale"),
    ],
)
def test_compare(recorded: list[Recorded], held: Held, expected: list[Stale]) -> None:
    assert compare(recorded, held) == expected


@pytest.mark.parametrize(
    ("recorded", "held", "suspected", "remove", "suspects"),
    [
        pytest.param(
            [rec(A, "x", "gone")],
            Held(live(a=["x"])),
            [],
            [],
            [Stale(A, {"a:gone": "v"})],
            id="a first look only suspects",
        ),
        pytest.param(
            [rec(A, "x", "gone")],
            Held(live(a=["x"])),
            [Stale(A, {"a:gone": "v"})],
            [Stale(A, {"a:gone": "v"})],
            [],
            id="stale twice with the same value: removed",
        ),
        pytest.param(
            [rec(A, "x", "gone", value="new")],
            Held(live(a=["x"])),
            [Stale(A, {"a:gone": "v"})],
            [],
            [Stale(A, {"a:gone": "new"})],
            id="a value changed in between: suspected again, not removed",
        ),
        pytest.param(
            [rec(A, "x", "gone")],
            Held(live(a=["x", "gone"])),
            [Stale(A, {"a:gone": "v"})],
            [],
            [],
            id="registered again in between: neither",
        ),
        pytest.param(
            [rec(A, "x", "y")],
            Held(live(a=[])),
            [Stale(A, {"a:x": "v"})],
            [Stale(A, {"a:x": "v"})],
            [Stale(A, {"a:y": "v"})],
            id="of a client's stale services, only those seen twice",
        ),
        pytest.param(
            [rec(A, "x")],
            Held({}),
            [Stale(A, {"a:x": "v"}, departed=True)],
            [Stale(A, {"a:x": "v"}, departed=True)],
            [],
            id="departed twice, same services: removed",
        ),
        pytest.param(
            [rec(A, "x")],
            Held({}),
            [],
            [],
            [Stale(A, {"a:x": "v"}, departed=True)],
            id="departed once (a departure still being cleaned up, a claim in flight): only suspected",
        ),
        pytest.param(
            [rec(A, "x", "y")],
            Held({}),
            [Stale(A, {"a:x": "v"}, departed=True)],
            [],
            [Stale(A, {"a:x": "v", "a:y": "v"}, departed=True)],
            id="departed but its services changed in between: suspected again",
        ),
        pytest.param(
            [rec(A, "x")],
            Held({}),
            [Stale(A, {"a:x": "v"})],
            [],
            [Stale(A, {"a:x": "v"}, departed=True)],
            id="live before, gone now: a departure is confirmed only by two looks at it",
        ),
        pytest.param(
            [rec(A, "x")],
            Held({}, away={A}),
            [Stale(A, {"a:x": "v"}, departed=True)],
            [],
            [],
            id="suspected, then in transit: left to its grace",
        ),
    ],
)
def test_stale_entries(
    recorded: list[Recorded], held: Held, suspected: list[Stale], remove: list[Stale], suspects: list[Stale]
) -> None:
    verdict = stale_entries(recorded, held, suspected)
    assert (verdict.remove, verdict.suspects) == (remove, suspects)
