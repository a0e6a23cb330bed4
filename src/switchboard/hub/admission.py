"""Who may connect, as whom, into which workspace, within which limits.

The first frame names a client; the :class:`Gatekeeper` turns it into an
authenticated user and a workspace (protocol §6.6), or a refusal with the
message the client will see, and keeps the hub-wide connection counts.
"""

from __future__ import annotations

from collections.abc import Callable

from switchboard.backends.base import ConnectionCounts, Registry
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.errors import AuthError, BackendError, HandshakeError
from switchboard.hub.auth import Permission, TokenIssuer, User, new_anonymous_user, user_workspace
from switchboard.hub.credentials import Credentials
from switchboard.hub.limits import TokenBucket
from switchboard.hub.peer import Peer
from switchboard.protocol import handshake
from switchboard.protocol.handshake import CLOSE_GOING_AWAY, CLOSE_POLICY, Hello
from switchboard.protocol.services import ServiceQuery


class Gatekeeper:
    """Admission decisions for one replica; all state it counts lives in the backends."""

    def __init__(
        self,
        *,
        settings: Settings,
        issuer: TokenIssuer,
        credentials: Credentials,
        registry: Registry,
        counts: ConnectionCounts,
        clock: Clock,
    ) -> None:
        self.settings = settings
        self.issuer = issuer
        self.credentials = credentials
        self.registry = registry
        self.counts = counts
        self.clock = clock
        self.uncounted: list[tuple[str, str]] = []  # releases that failed, retried later

    async def admit(self, hello: Hello, *, workspace_here: Callable[[str], bool]) -> tuple[User, str, bool]:
        """Decide who the client is and which workspace it joins.

        Returns ``(user, workspace, reconnecting)`` or raises
        :class:`HandshakeError` with the message the client will see.
        """
        if hello.client_id == self.settings.manager_id:
            raise HandshakeError(
                f"Failed to establish connection: client_id {hello.client_id!r} is reserved for the hub's manager",
                CLOSE_GOING_AWAY,
            )
        if hello.reconnection_token:
            try:
                user = await self.credentials.verify(hello.reconnection_token)
            except AuthError as exc:
                raise HandshakeError(f"Authentication error: {exc}", CLOSE_POLICY) from None
            if user.client_id != hello.client_id or not user.current_workspace:
                raise HandshakeError(
                    "Authentication error: reconnection token was issued to another client",
                    CLOSE_POLICY,
                )
            workspace = user.current_workspace
            if hello.workspace and hello.workspace != workspace:
                raise HandshakeError(
                    f"Failed to establish connection: reconnection token is for workspace "
                    f"{workspace}, not {hello.workspace}",
                    CLOSE_GOING_AWAY,
                )
            return user, workspace, True
        if hello.token:
            try:
                user = await self.credentials.verify(hello.token)
            except AuthError as exc:
                raise HandshakeError(f"Authentication error: {exc}", CLOSE_POLICY) from None
            if user.client_id and user.client_id != hello.client_id:
                raise HandshakeError(
                    f"Authentication error: token is bound to client id {user.client_id}",
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
        if not user.can(workspace, Permission.READ):
            if await self._workspace_exists(workspace, workspace_here):
                raise HandshakeError(
                    f"Failed to establish connection: Permission denied for workspace: {workspace}",
                    CLOSE_GOING_AWAY,
                )
            raise HandshakeError(
                f"Failed to establish connection: 'Workspace {workspace} does not exist or is not accessible'",
                CLOSE_GOING_AWAY,
            )
        return user, workspace, False

    async def _workspace_exists(self, workspace: str, here: Callable[[str], bool]) -> bool:
        if workspace == "public" or here(workspace):
            return True
        return bool(await self.registry.find(ServiceQuery(workspace)))

    async def count_in(self, peer: Peer) -> None:
        """Enforce the hub-wide connection limits (fail open if the counter is unreachable)."""
        s = self.settings
        peer.rate = TokenBucket(rate=s.max_messages_per_second, burst=s.message_burst, clock=self.clock)
        try:
            per_user, per_workspace = await self.counts.add(peer.user.id, peer.workspace)
        except BackendError as exc:
            peer.log.warning("connection limits not enforced: %s", exc)
            return
        peer.counted = True
        if per_user > s.max_connections_per_user or per_workspace > s.max_connections_per_workspace:
            await self.count_out(peer)
            what, limit = (
                ("user " + peer.user.id, s.max_connections_per_user)
                if per_user > s.max_connections_per_user
                else ("workspace " + peer.workspace, s.max_connections_per_workspace)
            )
            raise HandshakeError(
                f"Too many connections for {what} (limit {limit}); close some and retry",
                handshake.CLOSE_TRY_AGAIN,
            )

    async def count_out(self, peer: Peer) -> None:
        if not peer.counted:
            return
        peer.counted = False
        try:
            await self.counts.remove(peer.user.id, peer.workspace)
        except BackendError as exc:
            peer.log.warning("connection count not released yet: %s", exc)
            self.uncounted.append((peer.user.id, peer.workspace))

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
