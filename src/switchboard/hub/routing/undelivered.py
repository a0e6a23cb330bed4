"""A frame on its way to one client, as the hub keeps it while it cannot be delivered yet.

A value and the one function that makes it, without I/O: the router decides
with it, the retry window (:mod:`switchboard.hub.transit.retry`), the transit and the
dispatch carry it.
"""

from __future__ import annotations

from typing import NamedTuple

from switchboard.errors import ProtocolError
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.calls import classify
from switchboard.protocol.link import relay


class Undelivered(NamedTuple):
    """A frame on its way to one client, with what failing it needs (a tuple: made for every frame routed)."""

    frame: bytes
    session: str | None
    caller: str
    event: bool = False  # a point-to-point event: keeps to the bus's shared path
    # a piece of a chunked message not yet walked for its receiver (its message_cache
    # operation): the replica that hands it to the receiver's connection walks it first
    op: str | None = None


def undelivered_of(data: bytes, *, walked: bool = False) -> Undelivered | None:
    """A frame (relayed or not) as the hub keeps it while it cannot be delivered; ``None``: malformed.

    ``walked``: it was already handed to a connection of its receiver here (a
    connection's leftovers), so a piece of a chunked message passed its walk.
    """
    try:
        _, _, frame = relay.unwrap(data)
        env = envelope.decode(frame)
    except ProtocolError:
        return None
    op = None if walked else classify(env.main.get("method"), env.session, env.rest).op
    return Undelivered(frame, env.session, str(env.main.get("from", "")), env.type != "method", op)
