"""The two small interfaces the hub needs from a backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from switchboard.errors import LimitExceeded
from switchboard.protocol.hypha.services import ServiceInfo, ServiceQuery

# ``handler(channel, data)``: a bus has one, for every channel it subscribed (:meth:`EventBus.listen`)
BusHandler = Callable[[str, bytes], None]


@dataclass(frozen=True, slots=True)
class Expiry:
    """What :meth:`Registry.expire_transit` found.

    ``expired``: the grace was over; the client's registrations were removed
    (``removed``) and the caller announces its departure. ``waiting``: not over
    yet, ``remaining`` seconds to go. ``none``: not in transit (back, or
    already expired by another replica).
    """

    state: Literal["expired", "waiting", "none"]
    removed: list[ServiceInfo] = field(default_factory=list)
    remaining: float = 0.0


@dataclass(frozen=True, slots=True)
class Claim:
    """What :meth:`Registry.claim` found.

    ``holder``: another user holds the client id, and nothing changed.
    Otherwise the claim holds, and ``previous_owner`` is the replica the
    client was connected to before, if another one (its copy there is stale).
    """

    holder: str | None = None
    previous_owner: str | None = None


@dataclass(frozen=True, slots=True)
class Arrival:
    """What the stores know about a connection asking to enter, read together before anything
    is decided (:meth:`Entrance.arrival`; one round trip on Redis, where it took five).

    ``revoked``: one of the token's ids was revoked (a store that cannot say raises instead:
    never taken as not revoked). ``deleted_at``: when the workspace was deleted, and
    ``record``: its record (both ``None`` also when the workspace store did not answer: the
    token keeps what it grants, no more). ``holder``: the user holding the client id;
    ``registration``: the client id's ``built-in`` service, if registered.
    """

    revoked: bool = False
    deleted_at: float | None = None
    record: dict[str, Any] | None = None
    holder: str | None = None
    registration: ServiceInfo | None = None


@dataclass(frozen=True, slots=True)
class Entering:
    """A connection asking in (:meth:`Entrance.enter`): ``user``'s client ``client_id`` in
    ``workspace``, live on replica ``owner``, within ``max_per_user`` connections of its
    principal and ``max_per_workspace`` in the workspace. ``counted_as``: whom the per-user
    limit counts (the accountable principal), else ``user``."""

    workspace: str
    client_id: str
    user: str
    owner: str
    max_per_user: int
    max_per_workspace: int
    counted_as: str | None = None

    @property
    def principal(self) -> str:
        """Whom the per-user limit counts."""
        return self.counted_as or self.user


@dataclass(frozen=True, slots=True)
class Entry:
    """What :meth:`Entrance.enter` did.

    ``over``: counting the connection in would pass the ``"user"`` or ``"workspace"``
    limit, and the id was not claimed. ``claim``: otherwise, the claim (refused if
    ``claim.holder``). ``counted``: the connection is counted now (the caller releases
    it when it ends or is refused); ``False`` with neither refusal: the counter did not
    answer and the limits were not enforced. ``per_user``, ``per_workspace``: the totals.
    """

    claim: Claim = field(default_factory=Claim)
    counted: bool = False
    over: Literal["user", "workspace"] | None = None
    per_user: int = 0
    per_workspace: int = 0


class Entrance(Protocol):
    """The stores' part of admitting one connection, in two steps: read, then enter."""

    async def arrival(self, token_ids: tuple[str, ...], workspace: str, client_id: str) -> Arrival:
        """What is known about the token ids, the workspace and the client id (see :class:`Arrival`)."""
        ...

    async def enter(self, entering: Entering) -> Entry:
        """Count the connection in and claim its client id for its user through its replica,
        unless either limit would be passed or another user holds the id (see :class:`Entry`).
        The limits are checked before the claim, as one step on Redis."""
        ...


class Registry(Protocol):
    """Service infos by full id ``<ws>/<cid>:<svc>``, visible to every replica."""

    async def register(self, info: ServiceInfo, *, encoded: str | None = None) -> ServiceInfo | None:
        """Store ``info`` (replacing one with the same id); return the one replaced.

        ``encoded``: ``info`` as JSON already (the size check's), for a store that keeps text."""
        ...

    async def unregister(self, service_id: str) -> ServiceInfo | None:
        """Remove one service by full id; return it, or ``None`` if it was not there."""
        ...

    async def remove_client(self, workspace: str, client_id: str, *, owner: str | None = None) -> list[ServiceInfo]:
        """Remove every service of one client; return what was removed.

        With ``owner``, only while that replica still owns the client: a
        replica cleaning up after a lost connection must not delete what the
        client has meanwhile registered through another replica. A transit
        mark of the client and its claim (:meth:`claim`) go with its registrations.
        """
        ...

    # A client id belongs to the user that first connected with it, until the
    # client leaves (its registrations and transit mark go, and so does the claim).

    async def holder(self, workspace: str, client_id: str) -> str | None:
        """The id of the user holding the client id, ``None`` if nobody does."""
        ...

    async def claim(self, workspace: str, client_id: str, *, user: str, owner: str) -> Claim:
        """Make ``user`` the holder of the client id, connected through replica ``owner``,
        unless another user holds it (see :class:`Claim`). One step: of two users
        claiming a free id at once, one gets it."""
        ...

    async def find(self, query: ServiceQuery) -> list[ServiceInfo]:
        """Every service matching ``query`` (``query.workspace`` may be ``*``)."""
        ...

    async def singletons(self, workspace: str, name: str) -> list[ServiceInfo]:
        """The ``singleton`` services named ``name`` registered in ``workspace``: what a new
        registration of that name may collide with, found without reading the workspace's other
        services (every client of a crowd may register a service of the same name)."""
        ...

    async def lost_data(self) -> bool:
        """Whether the store lost its contents since this replica last looked (re-assertion due):
        then an empty :meth:`find` proves nothing."""
        ...

    # A client in transit (its connection ended, it is expected back, see
    # switchboard.hub.sessions.in_transit) keeps its registrations; the store's own clock
    # decides when its grace is over, so every replica agrees.

    async def begin_transit(self, workspace: str, client_id: str, *, owner: str, grace: float) -> bool:
        """Mark the client in transit for ``grace`` seconds (a second call keeps the first deadline).

        ``False`` if another replica than ``owner`` owns it now: it is back already.
        """
        ...

    async def end_transit(self, workspace: str, client_id: str, *, owner: str) -> float | None:
        """The client is connected again, through ``owner``, which now owns its registrations.

        Returns how many seconds it was in transit, ``None`` if it was not.
        """
        ...

    async def expire_transit(self, workspace: str, client_id: str) -> Expiry:
        """End the client's transit if its grace is over, removing its registrations (see :class:`Expiry`)."""
        ...

    async def transits_due(self, limit: int = 100) -> list[str]:
        """``<ws>/<cid>`` of clients whose grace is over, at most ``limit``."""
        ...

    async def close(self) -> None: ...


class EventBus(Protocol):
    """Fire-and-forget delivery of bytes to whoever subscribed to a channel.

    Only publish and subscribe: what travels between replicas by other paths
    (direct links) is the replica layer's (:mod:`switchboard.replicas`).
    """

    async def start(self) -> bool:
        """Connect; return whether the bus is healthy (it keeps trying if not)."""
        ...

    @property
    def health(self) -> tuple[bool, str]:
        """``(healthy, reason)``: readiness reports it."""
        ...

    async def publish(self, channel: str, data: bytes) -> int:
        """Send ``data``; return how many subscribers received it (0 = nobody)."""
        ...

    def listen(self, handler: BusHandler) -> None:
        """Hand every message, whichever channel it came on, to ``handler(channel, data)``.

        Set once, by whoever takes the messages in (the replica layer's
        :class:`~switchboard.replicas.dataplane.unicast.Unicast`): a subscription then names
        only its channel, never a callable of its own.
        """
        ...

    async def subscribe(self, channel: str) -> None:
        """Have the messages on ``channel`` handed to the listener."""
        ...

    async def unsubscribe(self, channel: str) -> None: ...

    @property
    def subscriptions(self) -> tuple[int, int] | None:
        """``(desired, confirmed)`` channels: confirmed once the store acknowledged them on
        the live connection; ``None`` where nothing needs confirming (one process)."""
        ...

    async def close(self) -> None: ...


class ConnectionCounts(Protocol):
    """Live connections per user and per workspace, across every replica."""

    async def add(self, user: str, workspace: str) -> tuple[int, int]:
        """Count one more connection; return the hub-wide ``(user, workspace)`` totals."""
        ...

    async def remove(self, user: str, workspace: str) -> None: ...


# How long the data (environment, service types, bookmarks, event log) of a workspace
# without a persistent record lasts after its last write: a week spans a work cycle,
# while workspaces nobody created (every user has one) cannot pile up for ever.
WORKSPACE_DATA_TTL = 7 * 24 * 3600.0


# Deletion marks kept at once (the settings --max-deletions-per-user and --max-deletions say why)
MAX_DELETIONS_PER_PRINCIPAL = 10_000
MAX_DELETIONS = 250_000


def deletions_full(principal: str | None, limit: int) -> LimitExceeded:
    """What a deletion answers when its mark would pass a bound (``principal``: its own; ``None``: the hub's)."""
    why = "each is kept a year, until no token that could have granted its workspace is left"
    if principal is None:
        return LimitExceeded(
            f"The hub remembers its maximum of {limit} deleted workspaces (--max-deletions/SWITCHBOARD_MAX_DELETIONS); "
            f"{why}: retry later"
        )
    return LimitExceeded(
        f"Too many workspaces deleted by {principal}: at most {limit} deletions are remembered at once "
        f"(--max-deletions-per-user/SWITCHBOARD_MAX_DELETIONS_PER_USER); {why}"
    )


def workspace_data_full(limit: int) -> LimitExceeded:
    """What a write past the hub-wide ceiling on workspace data answers (every store alike)."""
    return LimitExceeded(
        f"The hub's workspace data is full ({limit} bytes, --max-workspace-data-bytes/"
        "SWITCHBOARD_MAX_WORKSPACE_DATA_BYTES): remove some, or retry once older data has expired"
    )


class WorkspaceStore(Protocol):
    """Workspaces as records (owners, persistence), and the small data each keeps:
    named tables (``env``, ``types``, ``bookmarks``) and a capped event log.

    Records are plain JSON-ready dicts. Data of a workspace without a
    persistent record lasts ``ttl`` seconds after its last write, so
    workspaces nobody created cannot pile up; a persistent record keeps it.
    """

    async def get(self, workspace: str) -> dict[str, Any] | None:
        """The record of ``workspace``, or ``None`` if nobody created it."""
        ...

    async def put(self, record: dict[str, Any], *, overwrite: bool) -> bool:
        """Store ``record`` (keyed by its ``id``); ``False`` if one exists and not ``overwrite``."""
        ...

    async def remove(self, workspace: str) -> dict[str, Any] | None:
        """Delete the record and every table and log entry of ``workspace``; return the record."""
        ...

    async def records(self, limit: int) -> list[dict[str, Any]]:
        """At most ``limit`` records, in no particular order."""
        ...

    async def table_set(
        self, workspace: str, table: str, key: str, value: str | None, *, max_entries: int, keep: bool, only_new: bool
    ) -> bool:
        """Set (``None``: delete) one entry; ``False`` if it would make ``max_entries`` entries
        too many, or if ``only_new`` and the key exists. ``keep``: the workspace is persistent."""
        ...

    async def table(self, workspace: str, table: str) -> dict[str, str]: ...

    async def log_append(self, workspace: str, entry: str, *, max_entries: int, keep: bool) -> None:
        """Append to the workspace's log, dropping its oldest entries beyond about ``max_entries``."""
        ...

    async def log_entries(self, workspace: str, limit: int) -> list[str]:
        """The log, oldest first, at most the last ``limit`` entries."""
        ...

    async def mark_deleted(self, workspace: str, at: float, *, ttl: float, principal: str) -> None:
        """Record that ``workspace`` was deleted at ``at`` (epoch seconds), for ``ttl`` seconds, charged to
        ``principal``; :class:`LimitExceeded` (nothing recorded) past the principal's or the hub's bound."""
        ...

    async def deleted_at(self, workspace: str) -> float | None:
        """When ``workspace`` was last deleted, if that is recorded (and not expired: every token issued before it has expired by then)."""
        ...
