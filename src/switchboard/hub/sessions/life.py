"""A client connection's life on one replica, as one state machine: from joining to gone.

Its stage goes one way (:class:`Stage`): *joining* while admission reads the
stores (a deletion or revocation notice meanwhile refuses it), *admitted*,
*live* once attached, *ended* (by the client, with or without a goodbye, or by
the hub), then, once the hub let it go, *in transit* (its client is expected
back, until a deadline) or *gone*. A later connection of the same client is
*back* (it ended the transit), and *fresh* for :data:`FRESH_GOODBYE` after.

As in websockets' ``Protocol``, the transitions do no I/O: each returns the
effects that follow (:mod:`switchboard.hub.sessions.effects`), which the hub
carries out, and an I/O's answer comes back as the next transition
(:meth:`Life.departed`). The hub's monotonic time is passed in. Every row is a
synchronous test (``tests/hub/test_life.py``).

A :class:`~switchboard.hub.sessions.peer.Peer` holds the life of its
connection; the door that admits it makes it (:meth:`Hub.joining`), so one
value tells a refusal at admission from one at the attach from a failure
after it.
"""

from __future__ import annotations

import enum
from collections.abc import Collection

from switchboard.hub.identity.users import User
from switchboard.hub.sessions.effects import (
    Depart,
    Effect,
    Expect,
    HandOn,
    JoinWorkspace,
    LeaveWorkspace,
    Listen,
    Purge,
    RefuseJoin,
    Resume,
    Salvage,
    Supersede,
    TakeOver,
    Unlisten,
)

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


class Stage(enum.IntEnum):
    """Where a connection's life is; it only moves forward."""

    JOINING = 1  # admission reads the stores; a notice meanwhile refuses it
    ADMITTED = 2  # the hub knows who it is; the attach is under way
    LIVE = 3  # attached: the live connection of its client here
    ENDED = 4  # closed (why: the code, who closed it); the hub has not let it go yet
    IN_TRANSIT = 5  # its client is expected back, until a deadline (a drop, a hand-over)
    GONE = 6  # let go: its client left, or a newer connection of it is live


class TransitionError(RuntimeError):
    """A transition asked of a life in a stage it does not follow (a bug in the caller)."""


class Life:
    """One connection's life (see the module docstring). Slots: thousands of idle clients have one."""

    __slots__ = (
        "stage", "was_live", "ended", "code", "reason", "by_client", "goodbye", "until", "returned", "arrived_at",
        "workspace", "ids", "refusal", "_current", "_workspace_empty",
    )  # fmt: skip

    def __init__(self, stage: Stage = Stage.ADMITTED) -> None:
        self.stage = stage
        self.was_live = False  # its attach finished (whatever ended it since): a failure is no refusal
        self.ended = False  # read for every frame sent: a plain slot, kept with the stage
        self.code: int | None = None  # the close code, once ended
        self.reason = ""
        self.by_client = False  # the client ended it, not the hub
        self.goodbye = False  # ... and said goodbye doing so (GOODBYE_CODES)
        self.until: float | None = None  # in transit: the hub's time its grace ends
        self.returned = False  # it ended its client's transit ...
        self.arrived_at = 0.0  # ... and came in at this time (0: not a reconnection)
        # while joining: what a deletion or revocation notice concerns (hub/sessions/joins.py)
        self.workspace: str | None = None
        self.ids: Collection[str] = ()
        self.refusal: str | None = None  # why a notice refused it (the close reason it gets)
        self._current = False  # while being let go: it was the live connection of its client
        self._workspace_empty = False  # ... and the last here of its workspace

    # -- joining ---------------------------------------------------------------

    def expect(self, user: User, workspace: str) -> None:
        """Admission is about to read the stores: notices about ``workspace`` and ``user``'s
        credentials concern it from now on."""
        self.workspace = workspace
        self.ids = frozenset(user.revocation_ids)

    def refuse(self, reason: str) -> None:
        """A notice concerning it came before its join: the join is refused (the first reason stands)."""
        if self.stage < Stage.LIVE and self.refusal is None:
            self.refusal = reason

    def admitted(self) -> None:
        if self.stage is not Stage.JOINING:
            raise TransitionError(f"{self.stage.name}: only a joining connection is admitted")
        self.stage = Stage.ADMITTED

    def join(
        self,
        address: str,
        workspace: str,
        *,
        first_in_workspace: bool,
        took_over: bool,
        resume: bool,
        replaced: bool = False,
    ) -> list[Effect]:
        """It is in the hub's tables (where it ``replaced`` a live connection of its client): what
        makes it reachable, or its refusal (a notice came)."""
        if self.stage not in (Stage.ADMITTED, Stage.ENDED):  # ended meanwhile: it joins, then is let go
            raise TransitionError(f"{self.stage.name}: only an admitted connection joins")
        effects: list[Effect] = [Supersede(address, resume)] if replaced else []
        if self.refusal is not None:
            return [*effects, RefuseJoin(self.refusal)]
        effects.append(Listen(address))
        if first_in_workspace:
            effects.append(JoinWorkspace(workspace))
        if took_over:
            effects.append(TakeOver(address))
        if resume:
            effects.append(Resume(address))
        return effects

    def attached(self) -> None:
        """The join's effects are done: it is the live connection (unless it ended meanwhile)."""
        if self.stage not in (Stage.ADMITTED, Stage.ENDED):
            raise TransitionError(f"{self.stage.name}: only a joining connection is attached")
        self.was_live = True
        # notices reach it through the hub's tables from now on: what they concerned is not kept
        # for the connection's life (a set of credential ids for each of thousands of idle clients)
        self.workspace, self.ids = None, ()
        if self.stage is Stage.ADMITTED:
            self.stage = Stage.LIVE

    # -- ending ----------------------------------------------------------------

    def end(self, code: int, reason: str) -> bool:
        """The hub ends it with ``code``; ``False`` if it had ended already (the first end stands)."""
        if self.ended:
            return False
        self.ended, self.code, self.reason = True, code, reason
        self.stage = max(self.stage, Stage.ENDED)
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

    def left_in_transit(self, until: float) -> None:
        """The registry marked its client in transit, until ``until`` (the hub's time). The drain and
        the connection's own clean-up may both ask (the first mark stands); one already let go as
        gone stays gone (the registry's grace settles the client)."""
        if not self.ended:
            raise TransitionError(f"{self.stage.name}: only an ended connection's client is in transit")
        if self.stage is Stage.ENDED:
            self.stage, self.until = Stage.IN_TRANSIT, until

    @property
    def moving(self) -> bool:
        """Its client was put in transit when it ended."""
        return self.stage is Stage.IN_TRANSIT

    # -- let go ----------------------------------------------------------------

    def detached(self, address: str, *, current: bool, workspace_empty: bool) -> list[Effect]:
        """The hub took it out of its tables (it was the live connection of its client: ``current``;
        the last of its workspace here: ``workspace_empty``)."""
        if not self.ended:
            raise TransitionError(f"{self.stage.name}: a connection is let go once it ended")
        self._current, self._workspace_empty = current, workspace_empty
        return [Expect(address)] if current else []

    def counted_out(self, address: str, workspace: str, *, newer_here: bool) -> list[Effect]:
        """The hub-wide counts let it go: a newer connection of its client took over meanwhile
        (``newer_here``), or it stops listening and its client is asked to be put in transit."""
        if not self._current:
            self._gone()
            return []
        if newer_here:
            self._gone()
            return [HandOn(address)]
        effects: list[Effect] = [Unlisten(address)]
        if self._workspace_empty:
            effects.append(LeaveWorkspace(workspace))
        return [*effects, Depart(address)]

    def departed(self, address: str, workspace: str, client_id: str, *, in_transit: bool) -> list[Effect]:
        """The answer to :class:`Depart`: in transit (what it still had waits for the client), or it left."""
        if in_transit:
            return [Salvage(address)]
        self._gone()
        return [Purge(workspace, client_id)]

    def _gone(self) -> None:
        # a transit stays until its client is back or its grace ends; let go twice, it stays gone
        if self.stage is Stage.ENDED:
            self.stage = Stage.GONE

    # -- a client's next connection ------------------------------------------------

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
        how = f" {self.code}{' by client' if self.by_client else ''}" if self.ended else ""
        return f"<Life {self.stage.name.lower()}{how}{' back' if self.returned else ''}>"
