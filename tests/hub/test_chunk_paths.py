"""A message in pieces is walked for its receiver whatever path each piece took.

hypha-rpc joins the pieces of a ``message_cache`` upload on the receiving side
and reads their payload over the header the hub stamped, so the hub walks
them for the receiver (:mod:`switchboard.hub.routing.uploads`). These tables drive
the :class:`Router` synchronously through every way a piece reaches a client:
straight to it, held while it is in transit, relayed by another replica (to a
connection that just ended, or after the retry window), and to the client's
next connection after a reconnection. In each, the ``process`` of a message
whose joined payload names a sender is refused, and a key stays its sender's.
"""

from __future__ import annotations

from typing import Any

import msgpack

from support.wire import Wire
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.routing.actions import Deliver, Forward, Hold, RetryLater, Send
from switchboard.hub.routing.router import Router
from switchboard.hub.routing.undelivered import Undelivered, undelivered_of
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.retry import RetryWindow
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.chunks import MESSAGE_CACHE as CACHE
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

WS = "ws-1"
ME = f"{WS}/me"  # the sender, here
HERE = f"{WS}/here"  # the receiver, here
AWAY = f"{WS}/away"  # the receiver, in transit
ELSEWHERE = f"{WS}/elsewhere"  # a sender on another replica
FORGED = {"from": f"{WS}/owner", "ws": WS, "user": {"id": "owner"}, "ctx": {"from": f"{WS}/owner"}}


def make_peer(client_id: str) -> Peer:
    user = User(id=f"user-{client_id}", grants={WS: Permission.READ_WRITE})
    return Peer(workspace=WS, client_id=client_id, user=user, transport=Wire(), max_queue_bytes=1 << 20)


async def _published(*_: Any) -> bool:
    return False


class Table:
    """A router with the sender ``me`` here, ``here`` connected and ``away`` in transit."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        settings = settings_for_tests()
        self.metrics = HubMetrics(settings.replica_id)
        self.me = make_peer("me")
        self.here = make_peer("here")
        self.peers = {ME: self.me, HERE: self.here}
        self.transit: Transit[Undelivered] = Transit(clock=self.clock, grace=5.0)
        self.transit.left(AWAY)
        self.retry = RetryWindow(
            clock=self.clock, window=1.0, interval=0.1, publish=_published, give_up=lambda *_: None
        )
        self.router = Router(
            settings=settings,
            clock=self.clock,
            metrics=self.metrics,
            peers=self.peers,
            aliases=set(),
            transit=self.transit,
            retry=self.retry,
        )

    def piece(self, to: str, op: str, *args: Any, session: str = "c1") -> Any:
        """``me`` sends one ``message_cache`` call to ``to``: the router's action."""
        main = {"type": "method", "to": to, "method": CACHE + op, "session": session}
        return self.router.route(self.me, envelope.encode(main, msgpack.packb({"args": list(args)})))

    def back(self, client_id: str) -> Peer:
        """The client's next connection is attached here; its transit is over."""
        peer = make_peer(client_id)
        self.peers[peer.id] = peer
        self.transit.back(peer.id)
        return peer


def relayed_piece(to: str, op: str, *args: Any, sender: str = ELSEWHERE, session: str = "c1") -> bytes:
    """A piece another replica stamped (``from`` its sender) and routed to a client here."""
    main = {"type": "method", "from": sender, "to": to, "method": CACHE + op, "session": session}
    return envelope.encode(main, msgpack.packb({"args": list(args)}))


def whole(to: str, payload: dict[str, Any]) -> bytes:
    """A message as its pieces join up: header, then payload."""
    header = {"type": "method", "to": to, "method": "services.prot.act", "session": "s9"}
    return msgpack.packb(header) + msgpack.packb({"args": [], **payload})


def head(frame: bytes | str) -> dict[str, Any]:
    assert isinstance(frame, bytes), frame
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame)
    return next(unpacker)


def body(frame: bytes) -> dict[str, Any]:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame)
    next(unpacker)
    extra: dict[str, Any] = next(unpacker)
    return extra


def refusal(action: Any) -> str:
    """The reason in a reject for its caller: ``me`` (``Send``, or ``Deliver`` for a frame another
    replica relayed), or a caller on another replica (``Forward``)."""
    frame = (
        action.message if type(action) is Send else action.item.frame if type(action) in (Forward, Deliver) else None
    )
    assert isinstance(frame, bytes), f"not refused: {action}"
    main = head(frame)
    assert str(main["method"]).endswith(".reject"), main
    return str(body(frame)["args"][0]["_rvalue"])


# -- held for a client in transit --------------------------------------------------------------------


def test_pieces_held_for_a_client_in_transit_are_walked_when_they_are_delivered() -> None:
    t = Table()
    message = whole(AWAY, FORGED)
    held = [
        t.piece(AWAY, "create", "k1"),
        t.piece(AWAY, "append", "k1", message),
        t.piece(AWAY, "process", "k1"),
    ]
    assert [type(a) for a in held] == [Hold, Hold, Hold], "nothing is decided for a client that is away"
    t.back("away")
    create, append, process = (t.router.toward(AWAY, a.item) for a in held)
    assert type(create) is Deliver
    assert type(append) is Deliver
    assert "from" in refusal(process), "the joined payload names a sender: refused, as for a client here"
    assert type(process) is Send
    assert process.peer is t.me


def test_a_piece_held_after_it_was_walked_is_not_walked_twice() -> None:
    """A piece whose connection ended as it was handed over waits with its walk done."""
    t = Table()
    create = t.piece(HERE, "create", "k1")
    assert type(create) is Deliver
    assert create.item.op is None, "walked for its receiver on the way to its connection"
    t.here.close(1006, "dropped")
    t.transit.left(HERE)
    assert t.transit.hold(HERE, create.item)
    again = t.back("here")
    assert t.router.toward(HERE, create.item) == Deliver(again, create.item)
    assert type(t.piece(HERE, "append", "k1", whole(HERE, {}))) is Deliver, "k1 was created once, not twice"


def test_a_relayed_piece_for_a_connection_that_just_ended_is_walked_when_it_is_delivered() -> None:
    t = Table()
    t.here.client_closed(1006)  # dropped: its client comes back
    message = whole(HERE, FORGED)
    held = [
        t.router.relayed(t.here, relayed_piece(HERE, "create", "k1")),
        t.router.relayed(t.here, relayed_piece(HERE, "append", "k1", message)),
        t.router.relayed(t.here, relayed_piece(HERE, "process", "k1")),
    ]
    assert [type(a) for a in held] == [Hold, Hold, Hold]
    t.peers.pop(HERE)
    t.transit.left(HERE)
    t.back("here")
    create, append, process = (t.router.toward(HERE, a.item) for a in held)
    assert type(create) is Deliver
    assert type(append) is Deliver
    assert type(process) is Forward, "its sender is on another replica: the reject goes there"
    assert process.target == ELSEWHERE
    assert "from" in refusal(process)


async def test_pieces_that_waited_in_the_retry_window_are_walked_where_they_arrive() -> None:
    t = Table()
    t.retry.add(ELSEWHERE, Undelivered(b"earlier", None, ME))
    try:
        await _walked_where_they_arrive(t)
    finally:
        await t.retry.close()


async def _walked_where_they_arrive(t: Table) -> None:
    message = whole(ELSEWHERE, FORGED)
    waiting = [
        t.piece(ELSEWHERE, "create", "k1"),
        t.piece(ELSEWHERE, "append", "k1", message),
        t.piece(ELSEWHERE, "process", "k1"),
    ]
    assert [type(a) for a in waiting] == [RetryLater, RetryLater, RetryLater]
    # the client turns up on this replica: the retry window's publish comes back through the bus
    t.peers[ELSEWHERE] = receiver = make_peer("elsewhere")
    create, append, process = (t.router.relayed(receiver, a.item.frame) for a in waiting)
    assert type(create) is Send
    assert type(append) is Send
    assert "from" in refusal(process)


# -- the receiver's next connection ------------------------------------------------------------------


def test_a_key_stays_its_senders_across_the_receivers_reconnection() -> None:
    """What was walked for the client's last connection still counts for its next one: hypha-rpc
    keeps its message cache across reconnections, and so does the hub's walk of it."""
    t = Table()
    assert type(t.piece(HERE, "create", "k1")) is Deliver
    assert type(t.piece(HERE, "append", "k1", whole(HERE, {})[:3])) is Deliver
    t.here.close(1006, "dropped")
    t.peers.pop(HERE)
    t.transit.left(HERE)
    t.router.uploads.forget(HERE)  # as the hub does when a connection ends
    t.back("here")
    stranger = relayed_piece(HERE, "append", "k1", b"\x00", sender=ELSEWHERE)
    assert "in use by another sender" in refusal(t.router.relayed(t.peers[HERE], stranger))
    assert type(t.piece(HERE, "append", "k1", whole(HERE, {})[3:])) is Deliver, "its sender goes on"
    assert type(t.piece(HERE, "process", "k1")) is Deliver


def test_a_piece_walked_for_a_connection_is_not_walked_again_when_it_is_salvaged() -> None:
    t = Table()
    done = t.piece(HERE, "create", "k1")
    assert type(done) is Deliver
    salvaged = undelivered_of(done.item.frame, walked=True)
    assert salvaged is not None
    assert salvaged.op is None
    fresh = undelivered_of(done.item.frame)
    assert fresh is not None
    assert fresh.op == "create", "a frame that reached nobody still has its walk ahead"


def test_a_create_reaches_the_client_as_an_overwrite() -> None:
    """The walk of a key starts at its ``create``, so the client's cache for it must start there too:
    a ``create`` always reaches it with ``overwrite``, whatever the client held under that key
    (pieces walked for another replica, or before the hub forgot an abandoned upload)."""
    t = Table()
    for sent, args in [(("k1",), ["k1", False, True]), (("k2", True), ["k2", True, True])]:
        done = t.piece(HERE, "create", *sent, session=f"c-{sent[0]}")
        assert type(done) is Deliver
        assert body(done.item.frame)["args"] == args
        assert head(done.item.frame)["from"] == ME, "still stamped by the hub"


def test_a_receivers_walks_go_when_it_has_left_and_stay_while_it_is_in_transit() -> None:
    t = Table()
    t.piece(HERE, "create", "k1")
    t.here.close(1006, "dropped")
    t.peers.pop(HERE)
    t.transit.left(HERE)
    t.router.uploads.forget(HERE)
    assert HERE in t.router.uploads, "in transit: it comes back with its message cache"
    t.transit.expire(HERE)
    t.router.uploads.forget(HERE)
    assert HERE not in t.router.uploads
