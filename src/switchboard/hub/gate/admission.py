"""Who may connect, as whom, into which workspace, within which limits.

The first frame names a client; the :class:`Gatekeeper` turns it into an
authenticated user and a workspace (protocol §6.6), or a refusal with the
message the client will see, and keeps the hub-wide connection counts.
:func:`take_over` decides what the connection may do to the client id it
names: a client id belongs to the user that first connected with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from switchboard.backends.base import Arrival, Claim, ConnectionCounts, Entering, Entrance, Registry, WorkspaceStore
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.errors import AuthError, BackendError, HandshakeError
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.credentials import REVOKED, Credentials
from switchboard.hub.identity.users import Permission, User, new_anonymous_user, user_workspace
from switchboard.hub.routing.balance import is_virtual
from switchboard.hub.routing.limits import TokenBucket
from switchboard.hub.sessions.life import Life
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import handshake
from switchboard.protocol.hypha.handshake import CLOSE_GOING_AWAY, CLOSE_POLICY, Hello
from switchboard.protocol.hypha.services import ServiceQuery


@dataclass(frozen=True, slots=True)
class Takeover:
    """What a new connection may do to the client id it names (:func:`take_over`), as a value.

    ``refusal``: it may not have the id (the message it gets). Otherwise it
    becomes the client's live connection, superseding every other copy
    hub-wide, and: ``resume`` (it presented the client's reconnection token)
    it gets what was held for the client in transit; ``probe``, an earlier
    connection may still be live: if that answers a ping, the newcomer is a
    second live client with the same id and is refused; ``replace``, it
    starts a new session: the earlier session's registrations are removed
    (its departure announced) and what was held for it fails.
    """

    refusal: str | None = None
    resume: bool = False
    probe: bool = False
    replace: bool = False


@dataclass(frozen=True, slots=True)
class Admitted:
    """Who a connection is and which workspace it joins (:meth:`Gatekeeper.admit`), with what
    the stores knew about it then (``arrival``: :meth:`Gatekeeper.plan` decides on it, so that
    an admission asks the stores once)."""

    user: User
    workspace: str
    reconnecting: bool
    arrival: Arrival


def take_over(
    *,
    client: str,
    user: str,
    resuming: bool,
    holder: str | None,
    live_here: bool,
    registered: bool,
    in_transit: bool,
) -> Takeover:
    """Decide for ``user``'s connection naming ``client`` (``<ws>/<cid>``).

    ``holder`` is the user the client id belongs to (``None``: nobody);
    ``resuming``, whether the connection presented the client's reconnection
    token (a token of the holder, checked by :meth:`Gatekeeper.admit`);
    ``live_here``, whether a connection of the client is attached here;
    ``registered``, whether it has registrations; ``in_transit``, whether it is
    in transit. Only the holder may take the id, whatever a ping answers: a
    client in transit or whose event loop is busy answers none.
    """
    if holder is not None and holder != user:
        return Takeover(refusal=held_by_another(client))
    if resuming:
        return Takeover(resume=True)
    return Takeover(probe=live_here or registered, replace=not live_here and (registered or in_transit))


def deletion_refusal(user: User, workspace: str, deleted_at: float | None) -> str | None:
    """Why ``user`` may not enter ``workspace``, deleted at ``deleted_at``; ``None``: it may.

    A token issued before the deletion grants nothing there any more: not a
    member's, not the owner's reconnection token, not a client's in transit.
    ``iat`` has whole seconds, so a token issued in the second of the deletion
    counts as older (refused, never let in by rounding).
    """
    if deleted_at is None:
        return None
    if user.issued_at is None or user.issued_at < deleted_at:
        return f"Workspace {workspace} was deleted"
    return None


def held_by_another(client: str) -> str:
    """The refusal of a connection naming a client id that another user holds (a held id is a
    client connected or in transit: active, in Hypha's words)."""
    return (
        f"Failed to establish connection: Client already exists and is active: {client} belongs to another user "
        "(only that user, or the client's reconnection token, may take it over)"
    )


class Gatekeeper:
    """Admission decisions for one replica; all state it counts lives in the backends.

    Of each connection it let in it keeps the frame rate (:attr:`rates`, spent by the router)
    and whether the hub-wide counts include it (:meth:`counts_in`), until :meth:`count_out`.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        issuer: TokenIssuer,
        credentials: Credentials,
        registry: Registry,
        counts: ConnectionCounts,
        clock: Clock,
        entrance: Entrance,
        workspaces: WorkspaceStore | None = None,
    ) -> None:
        self.settings = settings
        self.issuer = issuer
        self.credentials = credentials
        self.registry = registry
        self.counts = counts
        self.clock = clock
        self.workspaces = workspaces
        self.entrance = entrance  # what an admission asks the stores, in two steps (one round trip each on Redis)
        self.uncounted: list[tuple[str, str]] = []  # releases that failed, retried later
        self._rates: dict[Peer, TokenBucket] = {}  # each connection's frame rate, from its entry to its count_out
        self._counted: set[Peer] = set()  # the connections the hub-wide counts include

    @property
    def rates(self) -> Mapping[Peer, TokenBucket]:
        """Each connection's frame rate (set when it entered, freed by :meth:`count_out`)."""
        return self._rates

    def counts_in(self, peer: Peer) -> bool:
        """Whether the hub-wide connection counts include ``peer``."""
        return peer in self._counted

    async def admit(
        self, hello: Hello, *, workspace_here: Callable[[str], bool], joining: Life | None = None
    ) -> Admitted:
        """Decide who the client is and which workspace it joins, or raise
        :class:`HandshakeError` with the message the client will see.

        The stores are asked once (:meth:`Entrance.arrival`), after the token's signature and
        claims are checked and before anything is decided on what they say: its revocation,
        the workspace's deletion and record, the client id's holder and registration.
        ``joining`` is told what the connection joins before the stores are asked, so that a
        deletion or revocation notice arriving from then until the join reaches it
        (:mod:`~switchboard.hub.sessions.joins`).
        """
        if hello.client_id == self.settings.manager_id:
            raise HandshakeError(
                f"Failed to establish connection: client_id {hello.client_id!r} is reserved for the hub's manager",
                CLOSE_GOING_AWAY,
            )
        if is_virtual(f"/{hello.client_id}"):
            raise HandshakeError(
                f"Failed to establish connection: client_id {hello.client_id[:64]!r} is reserved: "
                "'balance|...' addresses the hub's balanced handles",
                CLOSE_GOING_AWAY,
            )
        if hello.reconnection_token:
            user = await self._identify(hello.reconnection_token)
            if user.client_id != hello.client_id or not user.current_workspace:
                raise HandshakeError(
                    "Authentication error: Client id mismatch: the reconnection token was issued to another client",
                    CLOSE_POLICY,
                )
            workspace = user.current_workspace
            if hello.workspace and hello.workspace != workspace:
                raise HandshakeError(
                    f"Failed to establish connection: reconnection token is for workspace "
                    f"{workspace}, not {hello.workspace}",
                    CLOSE_GOING_AWAY,
                )
            arrival = await self._arrival(user, workspace, hello.client_id, joining=joining)
            return Admitted(user, workspace, True, arrival)
        if hello.token:
            user = await self._identify(hello.token)
            if user.client_id and user.client_id != hello.client_id:
                raise HandshakeError(
                    "Authentication error: Client id mismatch: this token is restricted to client with "
                    f"client_id='{user.client_id}'",
                    CLOSE_POLICY,
                )
            if user.current_workspace and hello.workspace and hello.workspace != user.current_workspace:
                raise HandshakeError(
                    "Failed to establish connection: Failed to authenticate user: Current "
                    f"workspace encoded in the token ({user.current_workspace}) does not match "
                    f"the specified workspace ({hello.workspace})",
                    CLOSE_GOING_AWAY,
                )
            workspace = hello.workspace or user.current_workspace or user_workspace(user.id)
        else:
            user = new_anonymous_user()
            workspace = hello.workspace or user_workspace(user.id)
        arrival = await self._arrival(user, workspace, hello.client_id, token=bool(hello.token), joining=joining)
        user = user.with_ownership(workspace, arrival.record)
        if not user.can(workspace, Permission.READ):
            # a workspace someone created exists, as one in use does (Hypha says so of its records)
            if arrival.record is not None or await self._workspace_exists(workspace, workspace_here):
                raise HandshakeError(
                    f"Failed to establish connection: Permission denied for workspace: {workspace}",
                    CLOSE_GOING_AWAY,
                )
            raise HandshakeError(
                f"Failed to establish connection: 'Workspace {workspace} does not exist or is not accessible'",
                CLOSE_GOING_AWAY,
            )
        return Admitted(user, workspace, False, arrival)

    async def _identify(self, token: str) -> User:
        try:
            return await self.credentials.identify(token)
        except AuthError as exc:
            raise HandshakeError(f"Authentication error: {exc}", CLOSE_POLICY) from None

    async def _arrival(
        self, user: User, workspace: str, client_id: str, *, token: bool = True, joining: Life | None = None
    ) -> Arrival:
        """What the stores know, read at once; a ``token``'s connection is refused here if it was
        revoked or the workspace was deleted since it was issued (``BackendError`` if the
        revocations cannot be read: never taken as not revoked)."""
        if joining is not None:  # before the read: a notice from now on reaches it
            joining.expect(user, workspace)
        arrival = await self.entrance.arrival(user.revocation_ids, workspace, client_id)
        if not token:
            return arrival
        if arrival.revoked:
            raise HandshakeError(f"Authentication error: {REVOKED}", CLOSE_POLICY)
        refusal = deletion_refusal(user, workspace, arrival.deleted_at)
        if refusal is not None and (user.is_anonymous or not user.named_in((arrival.record or {}).get("owners"))):
            raise HandshakeError(refusal, CLOSE_POLICY)  # the record's owners as it is now enter by their ownership
        return arrival

    async def deletion(self, user: User, workspace: str) -> str | None:
        """Why ``user``'s token may not enter ``workspace`` (it was deleted after the token was issued).

        Creating the workspace again revives none of the old tokens (whoever creates it: a
        stranger may take a deleted name); the owners of the record as it is now enter by
        their ownership, whenever their token was issued.
        """
        if self.workspaces is None:
            return None
        try:
            refusal = deletion_refusal(user, workspace, await self.workspaces.deleted_at(workspace))
            if refusal is None or user.is_anonymous:
                return refusal
            record = await self.workspaces.get(workspace)
        except BackendError:
            return None  # the store is away: as for ownership, the token keeps what it grants
        return None if record is not None and user.named_in(record.get("owners")) else refusal

    async def as_owner(self, user: User, workspace: str) -> User:
        """``user`` with ``admin`` in ``workspace`` if its record names the user an owner
        (:meth:`User.with_ownership`, as at admission): for a request with no connection, an
        HTTP call into ``workspace``. A connection's is resolved once, at admission: its
        permission checks read the grant without asking the store again.
        """
        if self.workspaces is None or user.is_anonymous or user.can(workspace, Permission.ADMIN):
            return user
        try:
            record = await self.workspaces.get(workspace)
        except BackendError:
            return user  # the store is away: the user keeps what its token grants, no more
        return user.with_ownership(workspace, record)

    async def plan(
        self, peer: Peer, *, resuming: bool, live_here: bool, in_transit: bool, arrival: Arrival | None = None
    ) -> Takeover:
        """What the registry knows about ``peer``'s client id (``arrival``, read at admission; else
        read now), decided on (:func:`take_over`)."""
        if arrival is None:
            arrival = await self.entrance.arrival((), peer.workspace, peer.client_id)
        holder = arrival.holder
        stale = arrival.registration if not resuming or holder is None else None
        if holder is None and stale:  # registered before the claim was recorded: its creator holds it
            creator = (stale.get("config") or {}).get("created_by") or {}
            holder = str(creator.get("id") or "") or None
        return take_over(
            client=peer.id,
            user=peer.user.id,
            resuming=resuming,
            holder=holder,
            live_here=live_here,
            registered=stale is not None,
            in_transit=in_transit,
        )

    async def claim(self, peer: Peer) -> Claim:
        """Record that ``peer``'s user holds its client id, live on this replica; refuse it if
        another user claimed the id since :meth:`plan` looked."""
        claim = await self.registry.claim(
            peer.workspace, peer.client_id, user=peer.user.id, owner=self.settings.replica_id
        )
        if claim.holder is not None:
            raise HandshakeError(held_by_another(peer.id), CLOSE_GOING_AWAY)
        return claim

    async def reclaim(self, peers: list[Peer]) -> None:
        """Claim the ids of clients connected here again (the store lost its data)."""
        for peer in peers:
            try:
                await self.claim(peer)
            except HandshakeError:
                peer.log.warning("its client id was claimed by another user while the store was empty")

    async def _workspace_exists(self, workspace: str, here: Callable[[str], bool]) -> bool:
        if workspace == "public" or here(workspace):
            return True
        return bool(await self.registry.find(ServiceQuery(workspace)))

    async def enter(self, peer: Peer) -> Claim:
        """Count ``peer`` in within the hub-wide connection limits (fail open if the counter is
        unreachable) and claim its client id for its user, live on this replica (one step,
        :meth:`Entrance.enter`); refused if a limit would be passed, or if another user claimed
        the id since :meth:`plan` looked."""
        s = self.settings
        entering = Entering(
            peer.workspace,
            peer.client_id,
            user=peer.user.id,
            owner=s.replica_id,
            max_per_user=s.max_connections_per_user,
            max_per_workspace=s.max_connections_per_workspace,
            counted_as=peer.user.accountable,  # a generated token's holders count as its maker
        )
        entry = await self.entrance.enter(entering)
        if entry.counted:
            self._counted.add(peer)
        if entry.over is not None:
            await self.count_out(peer)
            what, limit = (
                ("user " + peer.user.accountable, s.max_connections_per_user)
                if entry.over == "user"
                else ("workspace " + peer.workspace, s.max_connections_per_workspace)
            )
            raise HandshakeError(
                f"Too many connections for {what} (limit {limit}); close some and retry",
                handshake.CLOSE_TRY_AGAIN,
            )
        if entry.claim.holder is not None:
            await self.count_out(peer)
            raise HandshakeError(held_by_another(peer.id), CLOSE_GOING_AWAY)
        if not entry.counted:
            peer.log.warning("connection limits not enforced: the connection counter did not answer")
        self._rates[peer] = TokenBucket(rate=s.max_messages_per_second, burst=s.message_burst, clock=self.clock)
        return entry.claim

    async def count_out(self, peer: Peer) -> None:
        """``peer`` is gone (or was refused): its rate is freed and its count released."""
        self._rates.pop(peer, None)
        if peer not in self._counted:
            return
        self._counted.discard(peer)
        try:
            await self.counts.remove(peer.user.accountable, peer.workspace)
        except BackendError as exc:
            peer.log.warning("connection count not released yet: %s", exc)
            self.uncounted.append((peer.user.accountable, peer.workspace))

    async def retry_uncounted(self) -> None:
        """Release the counts a backend outage kept (the cluster loop calls this)."""
        pending, self.uncounted = self.uncounted, []
        for i, (user, workspace) in enumerate(pending):
            try:
                await self.counts.remove(user, workspace)
            except BackendError:
                self.uncounted.extend(pending[i:])
                return

    def reconnection_token(self, peer: Peer) -> str:
        return self.issuer.issue(
            peer.user,
            workspace=peer.workspace,
            permission=peer.user.permission(peer.workspace),
            expires_in=self.settings.reconnection_token_lifetime,
            client_id=peer.client_id,
            resumes=True,  # never past the credential the peer connected with
        )
