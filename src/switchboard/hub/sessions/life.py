"""A client connection's life, as a value: how it ended, and whether its client is coming back.

Open, then ended (by the client, with or without a goodbye, or by the hub),
then, for a client expected back, in transit; a later connection of the same
client is *back*, and *fresh* for :data:`FRESH_GOODBYE` after. Each rule is a
method here, clock-free (the hub's monotonic time is passed in), so that the
whole of it is specified synchronously (``tests/hub/test_life.py``). A
:class:`~switchboard.hub.sessions.peer.Peer` holds one; the peer ends it, the moves
(:mod:`switchboard.hub.transit.moves`) mark it in transit and back.
"""

from __future__ import annotations

# Close codes with which a client says goodbye (1000 normal closure, 1001 going
# away: a page closed): it has left. A connection that ends otherwise on the
# client's side (a drop, another code), or that a draining replica closes to
# send the client to a sibling (HANDED_OVER), has a reconnection on its way
# (switchboard.hub.sessions.in_transit). One the hub closes for cause (a slow consumer, an
# internal error) has left: the hub dropped it.
GOODBYE_CODES = frozenset({1000, 1001})
HANDED_OVER = 1012
# A goodbye (close 1000) within this many seconds of coming back from transit is not
# believed: hypha-rpc 0.21.47 sometimes reconnects twice at once (a call sent while
# its listener has not yet seen the drop opens a connection, then the listener opens
# another and closes the first with 1000). Measured 16 ms between the two; a client
# that really leaves that soon after coming back is announced after its grace instead.
FRESH_GOODBYE = 1.0


class Life:
    """One connection's life (see the module docstring). Slots: thousands of idle clients have one."""

    __slots__ = ("ended", "code", "reason", "by_client", "goodbye", "moving", "returned", "arrived_at")

    def __init__(self) -> None:
        self.ended = False
        self.code: int | None = None  # the close code, once ended
        self.reason = ""
        self.by_client = False  # the client ended it, not the hub
        self.goodbye = False  # ... and said goodbye doing so (GOODBYE_CODES)
        self.moving = False  # its client was put in transit when it ended
        self.returned = False  # it ended its client's transit ...
        self.arrived_at = 0.0  # ... and came in at this time (0: not a reconnection)

    def end(self, code: int, reason: str) -> bool:
        """The hub ends it with ``code``; ``False`` if it had ended already (the first end stands)."""
        if self.ended:
            return False
        self.ended, self.code, self.reason = True, code, reason
        return True

    def end_by_client(self, code: int) -> bool:
        """The client ended it (a close frame with ``code``, or the stream ended)."""
        if self.ended:
            return False
        self.by_client = True
        self.goodbye = code in GOODBYE_CODES
        return self.end(code, "client closed")

    @property
    def may_return(self) -> bool:
        """Whether it ended in a way its client comes back from (a drop, or a hand-over)."""
        return (self.by_client and not self.goodbye) or self.code == HANDED_OVER

    def expected_back(self, now: float, *, grace: float) -> bool:
        """Whether its client counts as in transit: it ended in a way it comes back from, or with a
        goodbye too fresh to believe (:data:`FRESH_GOODBYE`), and there is a grace to come back in."""
        return grace > 0 and self.ended and (self.may_return or self.fresh(now))

    def left_in_transit(self) -> None:
        """Its client was put in transit when it ended (the registry marked it)."""
        self.moving = True

    def arrived(self, now: float) -> None:
        """It is a client's reconnection, come in at ``now`` (whether or not it was in transit)."""
        self.arrived_at = now

    def back(self) -> None:
        """It ended its client's transit: it is fresh from :meth:`arrived` on."""
        self.returned = True

    def fresh(self, now: float) -> bool:
        """Whether it came back from transit less than :data:`FRESH_GOODBYE` ago."""
        return self.returned and now - self.arrived_at < FRESH_GOODBYE

    def just_arrived(self, now: float) -> bool:
        """Whether it is a reconnection less than :data:`FRESH_GOODBYE` old, transit or not: a second
        copy of its client elsewhere may be one hypha-rpc opened beside it and closes itself."""
        return self.arrived_at > 0 and now - self.arrived_at < FRESH_GOODBYE

    def __repr__(self) -> str:
        state = "open" if not self.ended else f"ended {self.code}{' by client' if self.by_client else ''}"
        return f"<Life {state}{' moving' if self.moving else ''}{' back' if self.returned else ''}>"
