"""The stores' part of an admission, asked of each store in turn (the embedded backends).

:class:`~switchboard.backends.redis.stores.entrance.RedisEntrance` answers the same
two questions in one round trip each; this one asks the stores one by one,
as admission always did, for any mix of stores (the embedded ones cost no
round trip at all).
"""

from __future__ import annotations

from typing import Literal

from switchboard.backends.base import Arrival, ConnectionCounts, Entering, Entry, Registry, WorkspaceStore
from switchboard.backends.revocations import Revocations
from switchboard.errors import BackendError
from switchboard.protocol.hypha.services import ServiceQuery


class StoreEntrance:
    """:class:`~switchboard.backends.base.Entrance` over separate stores."""

    def __init__(
        self,
        *,
        revocations: Revocations,
        registry: Registry,
        counts: ConnectionCounts,
        workspaces: WorkspaceStore | None = None,
    ) -> None:
        self.revocations = revocations
        self.registry = registry
        self.counts = counts
        self.workspaces = workspaces

    async def arrival(self, token_ids: tuple[str, ...], workspace: str, client_id: str) -> Arrival:
        revoked = bool(token_ids) and await self.revocations.any_revoked(token_ids)  # fails closed: raises
        deleted_at = record = None
        if self.workspaces is not None:
            try:
                deleted_at = await self.workspaces.deleted_at(workspace)
                record = await self.workspaces.get(workspace)
            except BackendError:
                pass  # the store is away: the token keeps what it grants
        holder = await self.registry.holder(workspace, client_id)
        found = await self.registry.find(ServiceQuery(workspace, client_id, "built-in"))
        return Arrival(
            revoked=revoked,
            deleted_at=deleted_at,
            record=record,
            holder=holder,
            registration=found[0] if found else None,
        )

    async def enter(self, entering: Entering) -> Entry:
        """See :meth:`~switchboard.backends.base.Entrance.enter`."""
        workspace, counted_as = entering.workspace, entering.principal
        try:
            per_user, per_workspace = await self.counts.add(counted_as, workspace)
        except BackendError:
            per_user = per_workspace = 0
            counted = False  # fail open: the limits are not enforced while the counter is away
        else:
            counted = True
            over: Literal["user", "workspace"] | None = None
            if per_user > entering.max_per_user:
                over = "user"
            elif per_workspace > entering.max_per_workspace:
                over = "workspace"
            if over is not None:
                return Entry(counted=True, over=over, per_user=per_user, per_workspace=per_workspace)
        try:
            claim = await self.registry.claim(workspace, entering.client_id, user=entering.user, owner=entering.owner)
        except BackendError:
            if counted:
                await self.counts.remove(counted_as, workspace)
            raise
        return Entry(claim=claim, counted=counted, per_user=per_user, per_workspace=per_workspace)
