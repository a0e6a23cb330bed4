"""Whether a lost link's unacked frame is sent again through Redis: the replay rule, beside the calls in flight.

A receiver that handled a frame just before its link died (its ack still on
the way) gets that frame a second time if it is replayed: harmless for a
reply (its caller has forgotten the session), not for a call, which would
run twice. A call made through this replica is known to have arrived once
its reply has passed back through here, so the rule is pure: replay
anything but a call that is no longer open in the router's
:class:`~switchboard.hub.routing.inflight.InFlight`. The replica layer's
unicast (:mod:`switchboard.replicas.dataplane.unicast`) asks it for every frame a lost
link gives back, through the predicate the hub hands it.
"""

from __future__ import annotations

from typing import Protocol

from switchboard.errors import ProtocolError
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.calls import is_call
from switchboard.protocol.link import relay


class OpenCalls(Protocol):
    """The calls this replica's clients (or its manager) wait on (the router's ``InFlight``)."""

    def is_open(self, caller: str, session: str) -> bool: ...


def worth_replaying(data: bytes, calls: OpenCalls) -> bool:
    """``False`` only for a call whose reply already came back: it arrived.

    ``data`` is a client channel's frame as the hub sent it (a manager call
    wrapped with its origin included); a frame this cannot read is not its
    to judge, and is replayed.
    """
    try:
        _, _, frame = relay.unwrap(data)
        env = envelope.decode(frame)
    except ProtocolError:
        return True
    session = env.session
    if not session or not is_call(env.main.get("method"), session):
        return True
    return calls.is_open(str(env.main.get("from")), session)
