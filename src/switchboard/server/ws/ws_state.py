"""Where one WebSocket connection is in its life, as websockets' ``State`` says it for its own.

One value instead of a flag for each stage: what may still be written, and
whether the app has heard the client leave, follow from it. A connection only
moves forward (:meth:`ConnectionState.allows`):

================  =====================================================================
state             reached by
================  =====================================================================
``CONNECTING``    the upgrade request: the app decides whether to let the client in
``OPEN``          the 101 written: frames both ways
``REFUSED``       an answer other than 101 written (a denial, a 403, a 500): the end
``CLOSING``       a close frame sent or received, or the connection failed: nothing more
                  is written but websockets' answer to the client's close
``HANDED_OVER``   a draining replica's notice, then the end of the stream: nothing more
                  is written; the client's last frames are still read
``CLOSED``        the transport is gone
================  =====================================================================

``read_paused`` is not part of it: reading pauses and resumes in any state
(flow control, as in asyncio).
"""

from __future__ import annotations

import enum


class ConnectionState(enum.Enum):
    """One connection's stage; the table in this module's docstring says what reaches each."""

    CONNECTING = "connecting"
    OPEN = "open"
    REFUSED = "refused"
    CLOSING = "closing"
    HANDED_OVER = "handed over"
    CLOSED = "closed"

    def allows(self, new: ConnectionState) -> bool:
        """Whether a connection in this state may move to ``new``: only forward, never to itself."""
        return new in _FORWARD[self]


CONNECTING = ConnectionState.CONNECTING
OPEN = ConnectionState.OPEN
REFUSED = ConnectionState.REFUSED
CLOSING = ConnectionState.CLOSING
HANDED_OVER = ConnectionState.HANDED_OVER
CLOSED = ConnectionState.CLOSED

_FORWARD: dict[ConnectionState, frozenset[ConnectionState]] = {
    # a client may close, or break the framing, before the app let it in
    CONNECTING: frozenset({OPEN, REFUSED, CLOSING, CLOSED}),
    OPEN: frozenset({CLOSING, HANDED_OVER, CLOSED}),
    REFUSED: frozenset({CLOSED}),
    CLOSING: frozenset({CLOSED}),
    # the client's close frame after a hand-over gets no answer (the stream has ended): it stays
    HANDED_OVER: frozenset({CLOSED}),
    CLOSED: frozenset(),
}

#: The states in which the 101 was never written: a connection lost then is 1006 to the app.
NEVER_OPENED = frozenset({CONNECTING, REFUSED})
