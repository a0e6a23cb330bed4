"""The routing decisions, as values: every kind of frame × where its target is × draining.

Synchronous, no event loop and no I/O: the :class:`Router` gets a sender and
a frame and answers with one action; these tables say which.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest

from support.wire import Wire
from switchboard.config import Settings
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.routing.actions import (
    Broadcast,
    Deliver,
    Forward,
    Hold,
    RetryLater,
    Send,
    SendToken,
    ToAlias,
    ToManager,
    ToReplica,
)
from switchboard.hub.routing.limits import TokenBucket
from switchboard.hub.routing.replays import worth_replaying
from switchboard.hub.routing.router import Router
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.retry import RetryWindow
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha import envelope, handshake
from switchboard.protocol.hypha.calls import CALL, CHUNK, OTHER, REPLY, classify, is_call
from switchboard.protocol.hypha.chunks import MESSAGE_CACHE as CACHE
from switchboard.protocol.link import replica_wire
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

WS = "ws-1"
ME = f"{WS}/me"
HERE = f"{WS}/here"  # a client of this replica
AWAY = f"{WS}/away"  # in transit
ELSEWHERE = f"{WS}/elsewhere"  # not here: another replica's, or nobody's (the bus will tell)
ALIAS = f"{WS}/http-abc"  # an HTTP caller the manager acts for


def make_peer(client_id: str, *, grants: dict[str, Permission] | None = None) -> Peer:
    user = User(id=f"user-{client_id}", grants={WS: Permission.READ_WRITE} if grants is None else grants)
    return Peer(workspace=WS, client_id=client_id, user=user, transport=Wire(), max_queue_bytes=1 << 20)


async def _published(*_: Any) -> bool:
    return False


class Table:
    """A router with two clients here (``me`` sends), one in transit, and an HTTP caller's alias."""

    def __init__(self, **settings: Any) -> None:
        self.clock = FakeClock()
        self.settings = settings_for_tests(**settings)
        self.metrics = HubMetrics(self.settings.replica_id)
        self.me = make_peer("me")
        self.here = make_peer("here")
        self.peers = {ME: self.me, HERE: self.here}
        self.rates: dict[Peer, TokenBucket] = {}  # each connection's frame rate (the gatekeeper's)
        self.transit: Transit[Undelivered] = Transit(clock=self.clock, grace=5.0)
        self.transit.left(AWAY)
        self.retry = RetryWindow(
            clock=self.clock, window=1.0, interval=0.1, publish=_published, give_up=lambda *_: None
        )
        self.router = self.router_for(self.settings)
        self.manager = self.router.manager_address

    def router_for(self, settings: Any) -> Router:
        """A router over this table's clients, transit and retry window, with ``settings``."""
        return Router(
            settings=settings,
            clock=self.clock,
            metrics=self.metrics,
            peers=self.peers,
            rates=self.rates,
            aliases={ALIAS},
            transit=self.transit,
            retry=self.retry,
        )

    def route(self, main: dict[str, Any], extra: dict[str, Any] | bytes | None = None, sender: Peer | None = None):
        rest = extra if isinstance(extra, bytes) else (msgpack.packb(extra) if extra is not None else b"")
        return self.router.route(sender or self.me, envelope.encode(main, rest))


def call(to: str, session: str = "s1", method: str = "services.svc.f") -> dict[str, Any]:
    return {"type": "method", "to": to, "method": method, "session": session}


def reply(to: str, session: str = "s1") -> dict[str, Any]:
    return {"type": "method", "to": to, "method": f"{session}.resolve"}


def chunk(to: str, op: str, session: str | None = "c1") -> dict[str, Any]:
    main: dict[str, Any] = {"type": "method", "to": to, "method": CACHE + op}
    if session:
        main["session"] = session
    return main


def message(payload: dict[str, Any]) -> bytes:
    """A message too large for one frame, as its pieces join up: header, then payload."""
    return msgpack.packb({"type": "method", "to": HERE, "method": "services.s.f"}) + msgpack.packb(payload)


def event(to: str) -> dict[str, Any]:
    return {"type": "my-event", "to": to, "data": 1}


def head(frame: bytes | str) -> dict[str, Any]:
    assert isinstance(frame, bytes), frame
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame)
    return next(unpacker)


def error_of(action: Any) -> str:
    assert type(action) is Send, action
    assert isinstance(action.message, str), action
    return action.message


def reject_of(action: Any) -> str:
    assert type(action) is Send, action
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(action.message)
    main, extra = next(unpacker), next(unpacker)
    assert main["method"].endswith(".reject"), main
    return extra["args"][0]["_rvalue"]


# -- the one classification ---------------------------------------------------


@pytest.mark.parametrize(
    ("method", "session", "rest", "expected"),
    [
        ("services.svc.f", "s1", b"", (CALL, None, None)),
        ("services.svc.f", None, b"", (OTHER, None, None)),  # no session: nobody waits for a reply
        ("s1.resolve", None, b"", (REPLY, "s1", None)),
        ("s1.s2.reject", None, b"", (REPLY, "s1.s2", None)),
        ("s1.heartbeat", None, b"", (OTHER, None, None)),
        (CACHE + "append", "c1", msgpack.packb({"args": ["s9", b"x"]}), (CHUNK, None, "append")),
        (CACHE + "process", "c1", msgpack.packb({"args": ["s9"]}), (CHUNK, "s9", "process")),
        (CACHE + "nonsense", "c1", b"", (OTHER, None, None)),  # neither an operation nor a call
        (None, "s1", b"", (OTHER, None, None)),
    ],
)
def test_a_frame_is_a_call_a_reply_a_chunk_or_other(method: Any, session: Any, rest: bytes, expected: Any) -> None:
    assert tuple(classify(method, session, rest)) == expected


# -- a client's frame × where its target is -------------------------------------

MANAGER = "manager"  # stands for */<manager_id>
CLOSED = f"{WS}/closed"  # a client here whose connection just ended (the dispatch holds or fails its frames)


def chunk_create(to: str) -> dict[str, Any]:
    return chunk(to, "create")


# Every kind of frame for one target × where the target is × whether this replica drains.
#    frame         target     idle       draining
TABLE = [
    (call, HERE, Deliver, RetryLater),  # a new call waits for the client elsewhere
    (call, CLOSED, Deliver, Deliver),
    (call, AWAY, Hold, Hold),
    (call, ELSEWHERE, Forward, Forward),  # another replica's, or nobody's: the publish tells
    (call, ALIAS, ToAlias, ToAlias),
    (call, MANAGER, ToManager, ToManager),
    (reply, HERE, Deliver, Deliver),  # what is under way finishes here
    (reply, CLOSED, Deliver, Deliver),
    (reply, AWAY, Hold, Hold),
    (reply, ELSEWHERE, Forward, Forward),
    (reply, ALIAS, ToAlias, ToAlias),
    (reply, MANAGER, ToManager, ToManager),
    (chunk_create, HERE, Deliver, Deliver),
    (chunk_create, CLOSED, Deliver, Deliver),
    (chunk_create, AWAY, Hold, Hold),
    (chunk_create, ELSEWHERE, Forward, Forward),
    (chunk_create, ALIAS, ToAlias, ToAlias),
    (chunk_create, MANAGER, ToManager, ToManager),
    (event, HERE, Deliver, Deliver),
    (event, CLOSED, Deliver, Deliver),
    (event, AWAY, Hold, Hold),
    (event, ELSEWHERE, Forward, Forward),
    (event, ALIAS, ToAlias, ToAlias),
    (event, MANAGER, ToManager, ToManager),
]


@pytest.mark.parametrize("draining", [False, True], ids=["idle", "draining"])
@pytest.mark.parametrize(("frame", "target", "idle", "when_draining"), TABLE)
def test_a_frame_for_one_client_goes_where_the_client_is(
    frame: Any, target: str, idle: type, when_draining: type, draining: bool
) -> None:
    t = Table()
    t.router.draining = draining
    t.peers[CLOSED] = make_peer("closed")
    t.peers[CLOSED].close(1006, "dropped")
    to = t.manager if target == MANAGER else target
    done = t.route(frame(to), {"args": ["k1"]} if frame is chunk_create else None)
    assert type(done) is (when_draining if draining else idle), done
    if isinstance(done, Deliver | Forward | Hold | RetryLater):
        sent = head(done.item.frame)
        assert (sent["from"], sent["ws"], sent["to"]) == (ME, WS, to), "stamped by the hub"
        assert done.item.caller == ME
        assert done.item.event == (frame is event), "an event keeps to the bus's shared path"


async def test_a_frame_for_a_client_others_already_wait_for_keeps_its_place_behind_them() -> None:
    t = Table()
    t.retry.add(ELSEWHERE, Undelivered(b"earlier", None, ME))
    try:
        assert type(t.route(call(ELSEWHERE))) is RetryLater
        assert type(t.route(event(ELSEWHERE))) is RetryLater
        assert type(t.route(call(HERE))) is Deliver
    finally:
        await t.retry.close()


def test_a_frame_held_for_a_client_in_transit_goes_on_as_usual_if_its_holding_is_full() -> None:
    done = Table().route(call(AWAY))
    assert type(done) is Hold
    assert type(done.otherwise) is Forward


def test_a_target_in_my_own_workspace_may_be_named_by_client_id_alone() -> None:
    done = Table().route(call("here"))
    assert type(done) is Deliver
    assert done.peer.id == HERE


# -- draining -------------------------------------------------------------------


def test_a_call_that_waits_for_the_drain_is_no_longer_in_flight_here() -> None:
    t = Table()
    t.router.draining = True
    t.route(call(HERE, "s1"))
    assert not t.router.inflight.is_open(ME, "s1"), "the drain must not wait for it"
    t.router.draining = False
    t.route(call(HERE, "s2"))
    assert t.router.inflight.is_open(ME, "s2")


# -- in flight --------------------------------------------------------------------


def test_a_call_is_in_flight_until_its_reply_passes() -> None:
    t = Table()
    t.route(call(HERE, "s1"))
    assert t.router.inflight.is_open(ME, "s1")
    assert t.router.inflight.busy(HERE)
    t.route(reply(ME, "s1"), sender=t.here)
    assert not t.router.inflight.is_open(ME, "s1")


def test_a_chunked_reply_closes_its_call_with_its_process() -> None:
    t = Table()
    t.route(call(ELSEWHERE, "s1"))
    t.route(chunk(ME, "create", None), {"args": ["s1"]}, sender=t.here)
    t.route(chunk(ME, "append", None), {"args": ["s1", message({"args": [1]})]}, sender=t.here)
    assert t.router.inflight.is_open(ME, "s1"), "a piece does not answer the call"
    assert type(t.route(chunk(ME, "process", None), {"args": ["s1"]}, sender=t.here)) is Deliver
    assert not t.router.inflight.is_open(ME, "s1")


def test_chunk_transfers_are_not_calls_of_their_own() -> None:
    t = Table()
    t.route(chunk(ELSEWHERE, "create"), {"args": ["k1"]})
    assert len(t.router.inflight) == 0


# -- limits -----------------------------------------------------------------------


def test_over_the_rate_a_call_is_rejected_and_fire_and_forget_is_dropped() -> None:
    t = Table()
    t.rates[t.me] = TokenBucket(rate=1, burst=1, clock=t.clock)
    assert type(t.route(call(HERE, "s1"))) is Deliver
    assert reject_of(t.route(call(HERE, "s2"))).startswith("Rate limit exceeded")
    assert t.route(event(HERE)) is None
    assert t.metrics.rate_limited._value.get() == 2


def test_over_the_rate_a_reply_to_an_open_call_still_goes() -> None:
    t = Table()
    t.route(call(ME, "s1"), sender=t.here)
    t.rates[t.me] = TokenBucket(rate=1, burst=0, clock=t.clock)
    assert type(t.route(reply(HERE, "s1"))) is Deliver, "the caller did nothing wrong"
    assert t.route(reply(HERE, "s-unknown")) is None, "a reply to nothing open is not exempt"


def test_a_caller_may_have_only_so_many_calls_waiting() -> None:
    t = Table(max_pending_calls=2)
    assert type(t.route(call(ELSEWHERE, "s1"))) is Forward
    assert type(t.route(call(ELSEWHERE, "s2"))) is Forward
    assert reject_of(t.route(call(ELSEWHERE, "s3"))).startswith("Too many pending calls")
    assert type(t.route(reply(HERE, "x"))) is Deliver, "replies and events are not calls"


def test_a_text_frame_takes_from_the_rate_too() -> None:
    t = Table()
    assert t.router.text(t.me, '{"type": "ping"}') == Send(t.me, handshake.PONG)
    assert type(t.router.text(t.me, '{"type": "refresh_token"}')) is SendToken
    assert t.router.text(t.me, '{"type": "nonsense"}') is None
    t.rates[t.me] = TokenBucket(rate=1, burst=0, clock=t.clock)
    assert "Rate limit exceeded" in error_of(t.router.text(t.me, '{"type": "ping"}'))


# -- the manager ------------------------------------------------------------------


def test_a_frame_for_the_manager_goes_to_this_replicas_manager_with_its_caller() -> None:
    t = Table()
    done = t.route(call(t.manager, "s1", "services.default.echo"))
    assert type(done) is ToManager
    assert done.caller is t.me
    assert head(done.frame)["from"] == ME


def test_a_reply_to_another_replicas_manager_goes_back_to_that_replica() -> None:
    t = Table()
    t.router.reply_routes.remember("m1", "replica-b")
    answer = t.route(reply(t.manager, "m1"))
    assert type(answer) is ToReplica
    assert answer.replica == "replica-b"
    piece = t.route(chunk(t.manager, "append", None), {"args": ["m1", b"x"]})
    assert piece == ToReplica("replica-b", piece.frame), "chunks of the reply follow it"
    assert type(t.route(reply(t.manager, "m2"))) is ToManager, "a call our own manager made"


async def test_a_reply_for_another_replicas_manager_keeps_its_place_behind_replies_waiting_for_it() -> None:
    t = Table()
    replies = RetryWindow(clock=t.clock, window=1.0, interval=0.1, publish=_published, give_up=lambda *_: None)
    t.router.replies = replies
    t.router.reply_routes.remember("m1", "replica-b")
    t.router.reply_routes.remember("m2", "replica-c")
    replies.add("replica-b", Undelivered(b"earlier reply", None, ""))
    try:
        assert t.route(reply(t.manager, "m1")).behind, "behind the earlier one, not over a link before it"
        assert not t.route(reply(t.manager, "m2")).behind, "nothing waits for replica-c"
    finally:
        await replies.close()


def test_the_manager_call_a_reply_answers_is_closed() -> None:
    t = Table()
    t.router.inflight.opened(t.manager, "m1", ME, t.peers)
    t.route(reply(t.manager, "m1"))
    assert not t.router.inflight.is_open(t.manager, "m1")


# -- broadcasts -------------------------------------------------------------------


def test_an_event_to_everyone_is_a_broadcast_into_my_workspace() -> None:
    done = Table().route(event("*"))
    assert done == Broadcast(WS, "my-event", done.frame)
    assert head(done.frame)["from"] == ME


@pytest.mark.parametrize(
    ("main", "grants", "why"),
    [
        (event("ws-2/*"), None, "cannot broadcast into workspace ws-2"),
        (event("*"), {WS: Permission.READ}, "cannot broadcast into workspace ws-1"),
        (call("*"), None, "cannot broadcast a method call"),
    ],
)
def test_a_broadcast_is_refused(main: dict[str, Any], grants: Any, why: str) -> None:
    t = Table()
    sender = make_peer("me", grants=grants) if grants is not None else t.me
    assert why in error_of(t.route(main, sender=sender))


@pytest.mark.parametrize("target", ["*/x", "*/manager-old"])
def test_a_star_workspace_names_only_the_manager_and_anything_else_fails_at_once(target: str) -> None:
    """``*`` is no workspace: the target never becomes a channel (no Forward), the caller learns why."""
    t = Table()
    assert "invalid target" in reject_of(t.route(call(target)))
    assert "invalid target" in error_of(t.route(event(target)))
    assert t.router.inflight.pending(ME) == 0


class RenamedManager(Settings):
    """Settings whose manager is not called ``manager-<server id>``."""

    @property
    def manager_id(self) -> str:
        return "manager-renamed"


def test_the_manager_is_the_one_the_settings_name() -> None:
    """One name for the manager (``Settings.manager_id``, as the hub's handshake tells clients):
    the router does not spell it again."""
    t = Table()
    base = t.settings
    t.router = t.router_for(RenamedManager(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}))
    assert type(t.route(call("*/manager-renamed"))) is ToManager
    assert "invalid target" in reject_of(t.route(call(f"*/manager-{base.server_id}")))


# -- the trust boundary -------------------------------------------------------------


@pytest.mark.parametrize(
    ("main", "extra", "why"),
    [
        ({**call(HERE), "ctx": {"from": "ws-1/admin"}}, None, "may not set 'ctx'"),
        (call(HERE), {"from": "ws-1/admin", "args": []}, "may not set from"),
        (call(HERE), {"user": {"id": "root"}}, "may not set user"),
        ({"type": "client_disconnected", "to": HERE}, None, "reserved for the server"),
        ({"type": "method", "to": "a/b/c"}, None, "invalid target"),
        ({"type": "method"}, None, "no 'to' target"),
    ],
)
def test_a_frame_that_claims_an_identity_is_refused_and_nothing_is_delivered(
    main: dict[str, Any], extra: Any, why: str
) -> None:
    t = Table()
    refused = error_of(t.route(main, extra))
    assert refused.startswith('{"type": "error"') or "Invalid message" in refused
    assert why in refused
    assert t.metrics.bad_frames._value.get() == 1
    assert len(t.router.inflight) == 0


def test_a_chunk_for_a_client_here_on_another_senders_key_is_refused() -> None:
    t = Table()
    other = make_peer("other")
    t.peers[other.id] = other
    assert type(t.route(chunk(HERE, "create"), {"args": ["k1"]})) is Deliver
    assert "in use by another sender" in reject_of(t.route(chunk(HERE, "append"), {"args": ["k1", b"x"]}, other))
    assert "in use by another sender" in error_of(t.route(chunk(HERE, "remove", None), {"args": ["k1"]}, other)), (
        "no session to reject: an error frame"
    )


def test_a_chunked_message_whose_payload_sets_a_reserved_key_is_refused_at_its_process() -> None:
    t = Table()
    t.route(chunk(HERE, "create"), {"args": ["k1"]})
    whole = message({"from": "ws-1/admin"})
    assert type(t.route(chunk(HERE, "append"), {"args": ["k1", whole[:5]]})) is Deliver
    assert type(t.route(chunk(HERE, "append"), {"args": ["k1", whole[5:]]})) is Deliver
    assert "from" in reject_of(t.route(chunk(HERE, "process"), {"args": ["k1"]}))


def test_chunks_for_a_client_elsewhere_are_walked_by_its_own_replica() -> None:
    t = Table()
    assert type(t.route(chunk(ELSEWHERE, "append"), {"args": ["k-never-created", b"x"]})) is Forward


# -- frames other replicas routed here ------------------------------------------------


def relayed_call(session: str = "r1", caller: str = ELSEWHERE) -> bytes:
    return envelope.encode({"type": "method", "from": caller, "to": HERE, "method": "services.s.f", "session": session})


def test_a_relayed_call_reaches_its_client_and_is_in_flight() -> None:
    t = Table()
    data = relayed_call()
    assert t.router.relayed(t.here, data) == Send(t.here, data)
    assert t.router.inflight.is_open(ELSEWHERE, "r1")


def test_a_relayed_frame_for_a_connection_that_just_ended_is_held_or_bounced() -> None:
    t = Table()
    t.here.client_closed(1006)  # dropped: its client comes back
    done = t.router.relayed(t.here, relayed_call())
    assert type(done) is Hold
    assert done.target == HERE
    bounce = done.otherwise
    assert type(bounce) is Forward, "back to its caller's replica, which fails it now (or sends a balanced call on)"
    assert bounce.target == ELSEWHERE
    callee, reject = replica_wire.unwrap_bounced(bounce.item.frame)
    assert callee == HERE
    env = envelope.decode(reject)  # what fails the call (never run) unless its caller's replica sends it on
    assert env.main["method"] == "r1.reject"
    assert f"Target peer {HERE} is not connected" in bytes(env.rest).decode(errors="replace")


def test_a_relayed_manager_call_is_held_with_its_origin() -> None:
    t = Table()
    t.here.client_closed(1006)  # dropped: its client comes back
    data = replica_wire.wrap_manager_call("replica-b", "m1", relayed_call("m1", "*/manager-x"))
    done = t.router.relayed(t.here, data)
    assert type(done) is Hold
    assert done.item.frame == data
    assert t.router.reply_routes.origin_of("m1") == "replica-b"


def test_a_relayed_chunk_refused_by_the_client_uploads_fails_its_caller() -> None:
    t = Table()
    piece = envelope.encode(
        {**chunk(HERE, "append"), "from": ELSEWHERE}, msgpack.packb({"args": ["k-never-created", b"x"]})
    )
    done = t.router.relayed(t.here, piece)
    assert type(done) is Forward
    assert done.target == ELSEWHERE
    assert head(done.item.frame)["method"] == "c1.reject"


def test_a_reply_from_a_provider_closes_our_managers_call() -> None:
    t = Table()
    t.router.inflight.opened(t.manager, "m1", ELSEWHERE, t.peers)
    done = t.router.manager_reply(envelope.encode(reply(t.manager, "m1")))
    assert type(done) is ToManager
    assert done.caller is None
    assert not t.router.inflight.is_open(t.manager, "m1")


# -- nobody has it ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caller", "action"),
    [(ME, Send), ("manager", ToManager), (ALIAS, ToManager), (ELSEWHERE, Forward)],
)
def test_a_caller_whose_target_is_nobodys_is_told_wherever_it_is(caller: str, action: Any) -> None:
    t = Table()
    caller = t.manager if caller == "manager" else caller
    done = t.router.undeliverable(AWAY, "s1", caller)
    assert type(done) is action
    frame = done.message if isinstance(done, Send) else done.frame if isinstance(done, ToManager) else done.item.frame
    assert head(frame)["method"] == "s1.reject"
    assert t.router.undeliverable(AWAY, None, ME) is None, "fire and forget: no reject storm"
    assert t.metrics.undeliverable._value.get() == 2


# -- the manager's own frames ---------------------------------------------------------------


def test_the_managers_call_is_stamped_trusted_and_in_flight() -> None:
    t = Table()
    data = envelope.encode(call(HERE, "m1", "services.built-in.ping"))
    done = t.router.from_manager(data, sender=t.manager, workspace=None, user={"id": "root"})
    assert type(done) is Deliver
    assert head(done.item.frame)["from"] == t.manager
    assert head(done.item.frame)["ws"] == WS
    assert t.router.inflight.is_open(t.manager, "m1"), "so the client's reply is never refused"
    assert t.router.from_manager(envelope.encode(call("here")), sender=t.manager, workspace=None, user={}) is None


# -- replays after a lost link ----------------------------------------------------------------


def test_a_lost_links_call_is_sent_again_only_while_its_caller_waits() -> None:
    t = Table()
    data = relayed_call("r1", ME)
    t.router.inflight.opened(ME, "r1", ELSEWHERE, t.peers)
    assert worth_replaying(data, t.router.inflight)
    t.router.inflight.closed(ME, "r1")
    assert not worth_replaying(data, t.router.inflight), "its reply came back: it arrived"
    assert worth_replaying(envelope.encode(reply(ME, "r1")), t.router.inflight), "a duplicate reply is harmless"


@pytest.mark.parametrize(
    "method",
    [
        "services.svc.f",
        "services.built-in.get_service",
        CACHE + "append",
        CACHE + "process",
        CACHE + "bogus",
        "s1.resolve",
        "s1.reject",
        "callback.x",
        None,
        42,
    ],
)
@pytest.mark.parametrize("session", ["s1", "", None])
def test_the_replay_rule_and_the_router_tell_calls_apart_alike(method: Any, session: str | None) -> None:
    """A lost link's frames are judged by :func:`is_call` (the replica layer's), the router by :func:`classify`."""
    assert is_call(method, session) == (classify(method, session, b"").kind == CALL)
