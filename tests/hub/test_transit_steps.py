"""What follows the I/O of a client in transit: the rules of :class:`TransitSteps`, as tables.

Each row is a story told to one replica on the fake clock, fact by fact (a
notice from another replica, frames for the client, the clock, the registry's
answer when asked to settle), and the steps the replica then takes, written
as words: ``held``/``refused`` (a frame for the client kept, or its holding
full), ``send on N`` (the held frames routed again, in order), ``fail`` (a
caller told "not connected"), ``forget`` (the client's uploads dropped),
``notify <kind>`` (a notice to every replica), ``announce gone``, ``fail
waiting``/``wake waiting`` (its frames in the retry window), ``back``,
``close copy``, ``wake keeper``. Steps of one fact are joined by ``,``; facts
by `` | ``. Nothing awaits: the moves only carry these steps out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.wire import Wire
from switchboard.backends.base import Expiry
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.routing.actions import Fail, Send
from switchboard.hub.routing.transit_steps import (
    RECHECK,
    AnnounceGone,
    CameBack,
    CloseCopy,
    FailWaiting,
    Forget,
    MarkInTransit,
    Notify,
    SendOn,
    TransitSteps,
    WakeKeeper,
    WakeWaiting,
    superseded_leftovers,
)
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.life import HANDED_OVER
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import envelope
from switchboard.testing.clock import FakeClock

WS = "ws-1"
CLIENT = f"{WS}/mover"
CALLER = f"{WS}/caller"
HERE, ELSEWHERE = "r-here", "r-other"
GRACE = 5.0
CAPACITY = 2  # frames a client's holding takes: one more is refused


def frame(session: str) -> bytes:
    return envelope.encode(
        {"type": "method", "from": CALLER, "to": CLIENT, "method": "services.s.f", "session": session}
    )


def item(session: str) -> Undelivered:
    return Undelivered(frame(session), session, CALLER)


def words(steps: list[Any]) -> str:
    """Steps as the table writes them."""
    out = []
    for step in steps:
        if type(step) is SendOn:
            out.append(f"send on {len(step.frames)}")
        elif type(step) is Notify:
            out.append(f"notify {step.kind}")
        else:
            out.append(
                {
                    Fail: "fail",
                    Forget: "forget",
                    AnnounceGone: "announce gone",
                    FailWaiting: "fail waiting",
                    WakeWaiting: "wake waiting",
                    CameBack: "back",
                    CloseCopy: "close copy",
                    WakeKeeper: "wake keeper",
                    Send: "send",
                }[type(step)]
            )
    return ", ".join(out) or "nothing"


def connection(end: str, clock: FakeClock, client: str = CLIENT) -> Peer:
    """A connection of the client here: ``open``, or ended by a ``drop`` (no goodbye), a drain's
    ``hand-over``, a ``goodbye``, a ``fresh goodbye`` (within a second of coming back), or the
    ``hub`` dropping it."""
    peer = Peer(
        workspace=WS,
        client_id=client.partition("/")[2],
        user=User(id="u", grants={WS: Permission.READ_WRITE}),
        transport=Wire(),
        max_queue_bytes=1 << 20,
    )
    if end == "drop":
        peer.client_closed(1006)
    elif end == "hand-over":
        peer.close(HANDED_OVER, "handed over")
    elif end == "goodbye":
        peer.client_closed(1000)
    elif end == "fresh goodbye":
        peer.life.arrived(clock.monotonic())
        peer.life.back()
        peer.client_closed(1000)
    elif end == "hub":
        peer.close(1008, "too slow")
    return peer


class Replica:
    """One replica's transit books on the fake clock, told facts one at a time."""

    def __init__(self, *, grace: float = GRACE, capacity: int = CAPACITY, peers: dict[str, Peer] | None = None):
        self.clock = FakeClock()
        self.transit: Transit[Undelivered] = Transit(clock=self.clock, grace=grace, max_frames=capacity)
        self.peers: dict[str, Peer] = peers or {}
        self.steps = TransitSteps(transit=self.transit, clock=self.clock, replica_id=HERE, peers=self.peers)
        self.sessions = 0

    def notice(self, kind: str, client: str = CLIENT, origin: str = ELSEWHERE, **extra: Any) -> bytes:
        return json.dumps({kind: client, "from": origin, **extra}).encode()

    def tell(self, fact: str) -> str:
        """One fact of a story; the steps it is followed by."""
        verb, _, arg = fact.partition(" ")
        if verb in ("left", "back", "gone", "abandoned"):
            extra = {"grace": float(arg)} if arg else {}
            return words(self.steps.on_notice(self.notice(verb, **extra)))
        if verb == "hold":
            said = []
            for _ in range(int(arg)):
                self.sessions += 1
                held, steps = self.steps.hold(CLIENT, item(f"s{self.sessions}"))
                said.append(", ".join(w for w in ("held" if held else "refused", words(steps)) if w != "nothing"))
            return ", ".join(said)
        if verb == "wait":
            self.clock.advance(float(arg))
            return "nothing"
        if verb == "settle":  # the keeper asks the registry about those due; arg: its answer
            due = self.steps.to_settle()
            if not due:
                return "asks nobody"
            state, _, remaining = arg.partition(" ")
            expiry = Expiry(state, [{"id": f"{CLIENT}:svc"}], float(remaining or 0))  # type: ignore[arg-type]
            return words([step for client in due for step in self.steps.settled(client, expiry)])
        if verb == "sweep":  # the registry's list of graces over that nobody here knew of
            return f"{self.steps.swept([CLIENT])} new"
        raise ValueError(fact)

    def story(self, facts: list[str]) -> str:
        return " | ".join(self.tell(fact) for fact in facts)


# notices in the order they come × frames and the holding × the registry's answer → the steps
# fmt: off
STORIES = [
    ("left, then back: the held frames go on, once, in order",
     ["left", "hold 2", "back"],
     "wake keeper | held, wake keeper, held | forget, send on 2, wake waiting"),
    ("a holding full refuses the next frame (the router's otherwise follows)",
     ["left", "hold 3"],
     "wake keeper | held, wake keeper, held, refused"),
    ("left, then gone: the held frames fail, and those in the retry window",
     ["left", "hold 1", "gone"],
     "wake keeper | held, wake keeper | fail waiting, forget, fail"),
    ("left, then abandoned for a new session: the same",
     ["left", "hold 1", "abandoned"],
     "wake keeper | held, wake keeper | fail waiting, forget, fail"),
    ("back with nothing held here: the retry window tries at once",
     ["back"],
     "wake waiting"),
    ("back overtaken by left, and lost: the registry says none at the recheck, and the frames go on",
     ["back", "left", "hold 1", f"wait {RECHECK}", "settle none"],
     "wake waiting | wake keeper | held, wake keeper | nothing | forget, send on 1"),
    ("frames held: nobody is asked before the recheck",
     ["left", "hold 1", f"wait {RECHECK / 2}", "settle none"],
     "wake keeper | held, wake keeper | nothing | asks nobody"),
    ("nothing held: nobody is asked before the grace is over",
     ["left", f"wait {GRACE - 0.1}", "settle expired"],
     "wake keeper | nothing | asks nobody"),
    ("the registry says waiting: asked again at its deadline, not ours",
     ["left", f"wait {GRACE}", "settle waiting 2", "wait 1.9", "settle expired", "wait 0.1", "settle expired"],
     "wake keeper | nothing | nothing | nothing | asks nobody | nothing"
     " | announce gone, notify gone, fail waiting, forget"),
    ("frames held: asked at every recheck; expired: announced, and the held frames fail",
     ["left", "hold 1", f"wait {RECHECK}", "settle waiting 4.5", f"wait {RECHECK}", "settle expired"],
     "wake keeper | held, wake keeper | nothing | nothing | nothing"
     " | announce gone, notify gone, fail waiting, forget, fail"),
    ("expired with nothing held: announced, nothing fails",
     ["left", f"wait {GRACE}", "settle expired"],
     "wake keeper | nothing | announce gone, notify gone, fail waiting, forget"),
    ("the grace is the leaving replica's, from its notice",
     ["left 2", "wait 2", "settle expired"],
     "wake keeper | nothing | announce gone, notify gone, fail waiting, forget"),
    ("a second notice of the same departure does not extend the grace",
     ["left", "wait 3", "left", "wait 2", "settle none"],
     "wake keeper | nothing | nothing | nothing | forget"),
    ("the grace over, the registry says none (expired by another replica, or back): frames go on",
     ["left", "hold 2", f"wait {GRACE}", "settle none"],
     "wake keeper | held, wake keeper, held | nothing | forget, send on 2"),
    ("a frame after the client is back is not held here",
     ["left", "back", "hold 1"],
     "wake keeper | forget, wake waiting | refused"),
    ("a transit nobody here knew of, swept: due at once, and announced if the registry expires it",
     ["sweep", "settle expired"],
     "1 new | announce gone, notify gone, fail waiting, forget"),
    ("a transit known here is not swept again",
     ["left", "sweep"],
     "wake keeper | 0 new"),
]
# fmt: on


@pytest.mark.parametrize(("story", "facts", "steps"), STORIES, ids=[row[0] for row in STORIES])
def test_a_replica_holding_frames_for_a_moving_client_follows_notices_and_the_registrys_answer(
    story: str, facts: list[str], steps: str
) -> None:
    assert Replica().story(facts) == steps


def test_a_notice_of_its_own_or_one_it_cannot_read_changes_nothing() -> None:
    replica = Replica()
    assert replica.steps.on_notice(replica.notice("left", origin=HERE)) == []
    assert replica.steps.on_notice(b"{not json") == []
    assert replica.steps.on_notice(b'{"left": "ws-1/mover"}') == []  # no origin
    assert CLIENT not in replica.transit


# how the connection ended × grace × the registry's answer to the mark × its leftovers (and what
# was held for the client since) → in transit?, the steps before the registry is asked, after it
DEPARTURES = [
    ("drop", GRACE, True, 0, 0, True, "wake keeper", "notify left"),
    ("hand-over", GRACE, True, 0, 0, True, "wake keeper", "notify left"),
    ("fresh goodbye", GRACE, True, 0, 0, True, "wake keeper", "notify left"),
    ("goodbye", GRACE, None, 1, 0, False, "not asked", "nothing"),
    ("hub", GRACE, None, 1, 0, False, "not asked", "nothing"),
    ("drop", 0.0, None, 1, 0, False, "not asked", "nothing"),
    # refused (back elsewhere, or the registry away): the leftovers go on with what was held here
    ("drop", GRACE, False, 0, 0, False, "wake keeper", "forget"),
    ("drop", GRACE, False, 1, 1, False, "wake keeper", "forget, send on 2"),
    ("drop", GRACE, False, 2, 1, False, "wake keeper", "fail, forget, send on 2"),  # the holding full
    ("drop", GRACE, False, 3, 0, False, "wake keeper", "fail, forget, send on 2"),
]


@pytest.mark.parametrize(("end", "grace", "marked", "leftovers", "held", "in_transit", "before", "after"), DEPARTURES)
def test_a_connection_that_ends_puts_its_client_in_transit_if_it_may_return_and_the_registry_marks_it(
    end: str, grace: float, marked: bool | None, leftovers: int, held: int, in_transit: bool, before: str, after: str
) -> None:
    replica = Replica(grace=grace)
    peer = connection(end, replica.clock)
    peer.unsent = [frame(f"left-{n}") for n in range(leftovers)]
    departure = replica.steps.departure(peer)
    if not isinstance(departure, MarkInTransit):
        assert (departure, "not asked", marked) == (in_transit, before, None)
        return
    assert words(list(departure.steps)) == before
    replica.tell(f"hold {held}")
    assert departure.grace == grace
    done, steps = replica.steps.marked(peer, marked=bool(marked), grace=grace)
    assert (done, words(steps)) == (in_transit, after)
    assert peer.life.moving == in_transit
    assert (CLIENT in replica.transit) == in_transit


def test_a_connection_already_in_transit_departs_without_asking_again() -> None:
    replica = Replica()
    peer = connection("drop", replica.clock)
    peer.life.left_in_transit(replica.clock.monotonic() + 5.0)
    assert replica.steps.departure(peer) is True


# leftovers of a client put in transit × frames held since × the holding (CAPACITY) → what is
# held, in order, and whose callers are told at once
SALVAGED = [
    (["a"], [], ["a"], []),
    (["a", "b"], [], ["a", "b"], []),
    (["a", "b"], ["x"], ["b", "x"], ["a"]),  # the newest kept, ahead of what came since
    (["a", "b", "c"], [], ["b", "c"], ["a"]),
    (["a", "b"], ["x", "y"], ["x", "y"], ["b", "a"]),  # full: every leftover fails, newest first
]


@pytest.mark.parametrize(("leftovers", "held", "kept", "failed"), SALVAGED)
def test_what_an_ended_connection_still_had_waits_ahead_of_what_came_since_the_newest_kept_first(
    leftovers: list[str], held: list[str], kept: list[str], failed: list[str]
) -> None:
    replica = Replica()
    replica.transit.left(CLIENT)
    for session in held:
        replica.transit.hold(CLIENT, item(session))
    peer = connection("drop", replica.clock)
    peer.unsent = [frame(s) for s in leftovers]
    steps = replica.steps.salvage(peer)
    assert [s.item.session for s in steps if isinstance(s, Fail)] == failed
    assert words(steps) == ", ".join(["fail"] * len(failed)) or "nothing"
    released = replica.transit.back(CLIENT)
    assert released is not None
    assert [i.session for i in released.frames] == kept


# the registry's answer on a reconnection (seconds away, or None: not in transit) × the client in
# transit here (frames held) → the steps
ARRIVALS = [
    (1.5, 2, "forget, send on 2, wake waiting, back, notify back", 1.5),
    (1.5, 0, "forget, wake waiting, back, notify back", 1.5),
    (1.5, None, "wake waiting, back, notify back", 1.5),
    (None, 1, "forget, send on 1, wake waiting, back, notify back", 0.25),  # away by this replica's books
    (None, None, "wake waiting", None),  # a reconnection that was in transit nowhere
]


@pytest.mark.parametrize(("away", "held_here", "steps", "reported"), ARRIVALS)
def test_a_client_that_reconnects_here_gets_what_waited_and_the_others_hear_it_is_back(
    away: float | None, held_here: int | None, steps: str, reported: float | None
) -> None:
    replica = Replica()
    if held_here is not None:
        replica.transit.left(CLIENT)
        replica.tell(f"hold {held_here}")
    replica.clock.advance(0.25)
    peer = connection("open", replica.clock)
    replica.steps.arriving(peer)
    done = replica.steps.arrived(peer, away=away)
    assert words(done) == steps
    assert [s.away for s in done if isinstance(s, CameBack)] == ([] if reported is None else [reported])
    assert peer.life.returned == (reported is not None)
    assert CLIENT not in replica.transit


def test_a_new_session_abandons_the_transit_the_held_frames_fail_everywhere() -> None:
    replica = Replica()
    assert replica.story(["left", "hold 2"]) == "wake keeper | held, wake keeper, held"
    assert words(replica.steps.abandoned(CLIENT)) == "forget, fail, fail, fail waiting, notify abandoned"
    assert words(replica.steps.abandoned(CLIENT)) == "fail waiting, notify abandoned"  # nothing left to fail


# the copy of the client here when another replica says it took the client over → the steps
TAKEN = [
    ("open", 5.0, "close copy"),
    ("open", 0.5, "nothing"),  # it reconnected under a second ago: hypha-rpc closes one copy itself
    ("drop", 5.0, "nothing"),  # ended already
    (None, 5.0, "nothing"),  # not here
]


@pytest.mark.parametrize(("copy", "since_arrival", "steps"), TAKEN)
def test_a_client_taken_over_elsewhere_has_its_copy_here_closed_unless_it_just_arrived(
    copy: str | None, since_arrival: float, steps: str
) -> None:
    replica = Replica()
    if copy is not None:
        peer = replica.peers[CLIENT] = connection(copy, replica.clock)
        replica.clock.advance(1.0)
        peer.life.arrived(replica.clock.monotonic())
        replica.clock.advance(since_arrival)
    assert words(replica.steps.on_notice(replica.notice("taken"))) == steps


# a frame for a client whose connection here just ended (``begins``) or that is in transit, and the holding
HOLDS = [
    (False, False, 0, "refused"),  # not in transit: the router's otherwise
    (True, False, 0, "held, wake keeper"),  # its transit begins with it
    (False, True, 0, "held, wake keeper"),  # the first frame held: the keeper rechecks from now
    (False, True, 1, "held"),
    (False, True, CAPACITY, "refused"),
]


@pytest.mark.parametrize(("begins", "moving", "held", "steps"), HOLDS)
def test_a_frame_is_held_while_its_clients_holding_has_room(begins: bool, moving: bool, held: int, steps: str) -> None:
    replica = Replica()
    if moving:
        replica.transit.left(CLIENT)
        for n in range(held):
            replica.transit.hold(CLIENT, item(f"h{n}"))
    done, after = replica.steps.hold(CLIENT, item("s"), begins=begins)
    assert ", ".join(w for w in ("held" if done else "refused", words(after)) if w != "nothing") == steps


def test_the_keeper_wakes_at_the_next_grace_or_a_recheck_while_frames_are_held() -> None:
    replica = Replica()
    assert replica.steps.next_wake() is None
    replica.transit.left(CLIENT)
    assert replica.steps.next_wake() == GRACE
    replica.tell("hold 1")
    assert replica.steps.next_wake() == RECHECK


def test_a_notice_reads_as_every_replica_writes_it() -> None:
    replica = Replica()
    left = json.loads(replica.steps.notice_bytes(Notify("left", CLIENT, grace=2.0)))
    assert left == {"left": CLIENT, "from": HERE, "grace": 2.0}
    assert json.loads(replica.steps.notice_bytes(Notify("gone", CLIENT))) == {"gone": CLIENT, "from": HERE}


# a client's new connection replaces a live one here: the old one's leftovers × resume → the actions
SUPERSEDED = [
    (True, [b"a", b"b"], ["send", "send"]),  # behind connection_info, as they are (what it has not read)
    (False, [frame("s1"), b"\xc1 unreadable"], ["fail"]),  # the earlier session's: its callers told
    (False, [], []),
]


@pytest.mark.parametrize(("resume", "leftovers", "actions"), SUPERSEDED)
def test_a_superseded_connections_leftovers_go_to_a_resumed_session_and_fail_for_a_new_one(
    resume: bool, leftovers: list[bytes], actions: list[str]
) -> None:
    new = connection("open", FakeClock())
    done = superseded_leftovers(new, leftovers, resume=resume)
    assert [words([a]) for a in done] == actions
    assert all(a.peer is new for a in done if isinstance(a, Send))
    assert all(a.target == new.id for a in done if isinstance(a, Fail))
