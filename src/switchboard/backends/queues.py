"""The task queues of ``public/queue``: one interface, the embedded store, and the bounds both keep.

A queue is named within a workspace and holds items (JSON text) first in,
first out. Every item is charged to a principal (who pushed it: the root of
its token chain, all anonymous users as one) and lives at most its lifetime;
a push past a bound is refused whole with :class:`~switchboard.errors.LimitExceeded`
and stores nothing:

* ``per_workspace`` items in all the queues of one workspace,
* ``per_principal`` items charged to one principal, in every workspace,
* ``total`` items in the hub.

The replicas of a hub share :class:`switchboard.backends.redis.stores.queues.RedisQueues`.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Literal, Protocol

import shortuuid

from switchboard.clock import Clock
from switchboard.errors import LimitExceeded

QueueRefusal = Literal["workspace", "principal", "total"]


@dataclass(frozen=True, slots=True)
class QueueBounds:
    per_workspace: int
    per_principal: int
    total: int


class QueueStore(Protocol):
    async def push(self, workspace: str, queue: str, item: str, *, principal: str, until: float) -> int:
        """Append ``item`` to the queue, kept until ``until`` (epoch s) and charged to ``principal``; the
        queue's length after it. :class:`LimitExceeded` past a bound (nothing stored)."""
        ...

    async def pop(self, workspace: str, queue: str) -> str | None:
        """Take the oldest item (``None``: the queue is empty); never waits."""
        ...

    async def peek(self, workspace: str, queue: str, n: int) -> list[str]:
        """The ``n`` oldest items, oldest first, left in the queue."""
        ...

    async def length(self, workspace: str, queue: str) -> int: ...


def new_item_id() -> str:
    return shortuuid.uuid()[:22]


def refused(kind: QueueRefusal, bounds: QueueBounds, *, workspace: str, principal: str) -> LimitExceeded:
    """The error a push past the bound ``kind`` answers."""
    if kind == "workspace":
        return LimitExceeded(
            f"Queue full: workspace {workspace} holds its maximum of {bounds.per_workspace} queued tasks "
            "(--max-queue-items-per-workspace/SWITCHBOARD_MAX_QUEUE_ITEMS_PER_WORKSPACE): pop some first"
        )
    if kind == "principal":
        return LimitExceeded(
            f"Too many queued tasks for {principal}: at most {bounds.per_principal} at once "
            "(--max-queue-items-per-user/SWITCHBOARD_MAX_QUEUE_ITEMS_PER_USER): pop some first"
        )
    return LimitExceeded(
        f"The hub holds its maximum of {bounds.total} queued tasks (--max-queue-items/SWITCHBOARD_MAX_QUEUE_ITEMS): "
        "retry later"
    )


@dataclass(slots=True)
class _Item:
    key: tuple[str, str]  # (workspace, queue)
    principal: str
    text: str
    until: float


class MemoryQueues:
    """One process's queues. Expired items are dropped in the order they expire (a heap), each once, by
    the operations that follow: the work is paid for by the pushes that made them."""

    def __init__(self, clock: Clock, bounds: QueueBounds) -> None:
        self.clock = clock
        self.bounds = bounds
        self._queues: dict[tuple[str, str], deque[str]] = {}
        self._items: dict[str, _Item] = {}
        self._expiring: list[tuple[float, str]] = []
        self._by_workspace: dict[str, int] = {}
        self._by_principal: dict[str, int] = {}

    async def push(self, workspace: str, queue: str, item: str, *, principal: str, until: float) -> int:
        self._drop_expired()
        b = self.bounds
        kind: QueueRefusal | None = None
        if self._by_workspace.get(workspace, 0) >= b.per_workspace:
            kind = "workspace"
        elif self._by_principal.get(principal, 0) >= b.per_principal:
            kind = "principal"
        elif len(self._items) >= b.total:
            kind = "total"
        if kind is not None:
            raise refused(kind, b, workspace=workspace, principal=principal)
        item_id = new_item_id()
        key = (workspace, queue)
        self._items[item_id] = _Item(key, principal, item, until)
        heapq.heappush(self._expiring, (until, item_id))
        self._queues.setdefault(key, deque()).append(item_id)
        self._by_workspace[workspace] = self._by_workspace.get(workspace, 0) + 1
        self._by_principal[principal] = self._by_principal.get(principal, 0) + 1
        return len(self._queues[key])

    async def pop(self, workspace: str, queue: str) -> str | None:
        self._drop_expired()
        ids = self._queues.get((workspace, queue))
        if not ids:
            return None
        item = self._forget(ids.popleft())
        if not ids:
            del self._queues[(workspace, queue)]
        return item.text

    async def peek(self, workspace: str, queue: str, n: int) -> list[str]:
        self._drop_expired()
        ids = self._queues.get((workspace, queue)) or deque()
        return [self._items[i].text for i, _ in zip(ids, range(n), strict=False)]

    async def length(self, workspace: str, queue: str) -> int:
        self._drop_expired()
        return len(self._queues.get((workspace, queue)) or ())

    def held_by(self, principal: str) -> int:
        return self._by_principal.get(principal, 0)

    def __len__(self) -> int:
        return len(self._items)

    def _forget(self, item_id: str) -> _Item:
        item = self._items.pop(item_id)
        for counts, name in ((self._by_workspace, item.key[0]), (self._by_principal, item.principal)):
            left = counts[name] - 1
            if left:
                counts[name] = left
            else:
                del counts[name]
        return item

    def _drop_expired(self) -> None:
        now = self.clock.time()
        while self._expiring and self._expiring[0][0] <= now:
            _, item_id = heapq.heappop(self._expiring)
            if item_id not in self._items:
                continue  # popped already
            item = self._forget(item_id)
            ids = self._queues[item.key]
            if ids[0] == item_id:  # items of one lifetime expire oldest first
                ids.popleft()
            else:  # the wall clock went back between pushes
                ids.remove(item_id)
            if not ids:
                del self._queues[item.key]
