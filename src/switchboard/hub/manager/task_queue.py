"""``public/queue``: Hypha's task queue service, kept in a :class:`~switchboard.backends.queues.QueueStore`.

The queues are the caller's workspace's (the connection's, never one the
message names): ``push`` and ``pop`` need ``read_write`` there, ``peek`` and
``get_length`` ``read``. An item is a JSON object of at most
``--max-queue-item-bytes`` (an anonymous workspace's: a sixteenth), charged to
the pusher's accountable principal for :data:`QUEUE_ITEM_LIFETIME` at most.

``pop`` with a ``timeout`` waits for an item by looking again every
:data:`POP_POLL` seconds (no Redis connection is held while it waits), and
returns ``None`` when the time is up or the caller has gone; at most
:data:`MAX_WAITING_POPS_PER_CLIENT` of one caller and :data:`MAX_WAITING_POPS`
in all wait on a replica at once, and one more is refused at once (retry
later). The checks of the arguments are plain functions.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from switchboard.backends.base import WORKSPACE_DATA_TTL
from switchboard.backends.queues import QueueStore
from switchboard.clock import Clock
from switchboard.errors import LimitExceeded, ProtocolError
from switchboard.hub.identity.credentials import payer
from switchboard.hub.identity.users import Permission
from switchboard.hub.manager.data_charges import may_store, value_limit
from switchboard.hub.manager.manager_door import calling_peer, require
from switchboard.protocol.hypha.values import plain

# Hypha's queue-name rule: 1 to 128 characters, letters and digits first, then also '_', '-' and '.'.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
# A queued task lives as long as a workspace's data without a persistent record: a week after it
# was pushed, so queues nobody pops do not pile up for ever.
QUEUE_ITEM_LIFETIME = WORKSPACE_DATA_TTL
# Hypha's bounds of pop's timeout and peek's count.
MAX_POP_TIMEOUT = 300.0
DEFAULT_POP_TIMEOUT = 30.0
MAX_PEEK = 100
# A waiting pop looks again this often: a task pushed on any replica is seen within this time.
POP_POLL = 0.2
# Pops waiting on one replica at once: each costs a task and a look every POP_POLL (5,000 looks a
# second at most), far below what one replica serves.
MAX_WAITING_POPS = 1000
# Of one caller (a worker pops one task at a time; a few in parallel at most): no client takes every place.
MAX_WAITING_POPS_PER_CLIENT = 16


def check_queue_name(name: object) -> str:
    if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
        raise ProtocolError(
            f"Invalid queue name: {str(name)[:140]!r}. Queue names must be 1-128 characters, start with a letter "
            "or digit, and contain only letters, digits, hyphens, underscores and dots."
        )
    return name


def check_pop_timeout(timeout: object) -> float:
    if timeout is None:
        return DEFAULT_POP_TIMEOUT
    if (
        not isinstance(timeout, int | float)
        or isinstance(timeout, bool)
        or not 0 <= timeout <= MAX_POP_TIMEOUT  # NaN fails this too
    ):
        raise ProtocolError(f"timeout must be a number of seconds from 0 to {MAX_POP_TIMEOUT:g}")
    return float(timeout)


def check_peek_count(n: object) -> int:
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_PEEK:
        raise ProtocolError(f"n must be a whole number from 1 to {MAX_PEEK}")
    return n


def encode_task(task: object, *, workspace: str, max_bytes: int) -> str:
    """``task`` as the JSON text queued, or a clear error (not an object, not JSON, too large)."""
    value = plain(task)
    if not isinstance(value, dict):
        raise ProtocolError("task must be an object (a dict of JSON values)")
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"task must hold only JSON values: {exc}") from None
    limit = value_limit(workspace, max_bytes)
    size = len(text.encode())
    if size > limit:
        raise LimitExceeded(
            f"Task too large: {size} bytes, at most {limit} in workspace {workspace} "
            "(--max-queue-item-bytes/SWITCHBOARD_MAX_QUEUE_ITEM_BYTES; an anonymous user's workspace: a sixteenth)"
        )
    return text


class TaskQueue:
    """The ``queue`` service's functions (see the module docstring)."""

    def __init__(self, store: QueueStore, *, clock: Clock, max_item_bytes: int) -> None:
        self.store = store
        self.clock = clock
        self.max_item_bytes = max_item_bytes
        self.waiting = 0  # pops waiting on this replica
        self._waiting_by: dict[str, int] = {}  # caller address -> its pops waiting

    def service(self) -> dict[str, Any]:
        """The service registered as ``public/queue``: its functions, with their parameters."""
        name: dict[str, Any] = {"queue_name": {"type": "string"}}
        return {
            "id": "queue",
            "name": "Task Queue Service",
            "description": "Task queues of the caller's workspace, first in, first out.",
            "config": {"visibility": "public", "require_context": True},
            "push": (self.push, {**name, "task": {"type": "object"}}),
            "pop": (self.pop, {**name, "timeout": {"type": "number"}}),
            "get_length": (self.get_length, name),
            "peek": (self.peek, {**name, "n": {"type": "integer"}}),
        }

    async def push(self, queue_name: Any, task: Any = None, context: dict[str, Any] | None = None) -> None:
        """Append a task (a JSON object) to a queue of the caller's workspace."""
        peer = calling_peer()
        ws = peer.workspace
        require(peer, ws, Permission.READ_WRITE)
        may_store(peer.user, ws)
        name = check_queue_name(queue_name)
        text = encode_task(task, workspace=ws, max_bytes=self.max_item_bytes)
        until = self.clock.time() + QUEUE_ITEM_LIFETIME
        await self.store.push(ws, name, text, principal=payer(peer.user), until=until)

    async def pop(self, queue_name: Any, timeout: Any = None, context: dict[str, Any] | None = None) -> Any:
        """Take the oldest task of a queue; wait at most ``timeout`` seconds (0: not at all) for one.
        ``None`` if none came."""
        peer = calling_peer()
        require(peer, peer.workspace, Permission.READ_WRITE)
        name = check_queue_name(queue_name)
        wait = check_pop_timeout(timeout)
        text = await self.store.pop(peer.workspace, name)
        if text is None and wait > 0:
            mine = self._waiting_by.get(peer.id, 0)
            if mine >= MAX_WAITING_POPS_PER_CLIENT:
                raise LimitExceeded(
                    f"Too many pops waiting for this client ({MAX_WAITING_POPS_PER_CLIENT}): let one end first, "
                    "or pop with timeout=0"
                )
            if self.waiting >= MAX_WAITING_POPS:
                raise LimitExceeded(
                    f"Too many pops waiting on this server ({MAX_WAITING_POPS}): retry later, or pop with timeout=0"
                )
            self.waiting += 1
            self._waiting_by[peer.id] = mine + 1
            try:
                deadline = self.clock.monotonic() + wait
                for _ in range(math.ceil(wait / POP_POLL) + 1):
                    left = deadline - self.clock.monotonic()
                    if left <= 0:
                        break
                    await self.clock.sleep(min(POP_POLL, left))
                    if peer.closed:
                        return None  # nobody to give it to: the task stays queued
                    text = await self.store.pop(peer.workspace, name)
                    if text is not None:
                        break
            finally:
                self.waiting -= 1
                left = self._waiting_by[peer.id] - 1
                if left:
                    self._waiting_by[peer.id] = left
                else:
                    del self._waiting_by[peer.id]
        return None if text is None else json.loads(text)

    async def get_length(self, queue_name: Any, context: dict[str, Any] | None = None) -> int:
        """How many tasks a queue of the caller's workspace holds."""
        peer = calling_peer()
        require(peer, peer.workspace, Permission.READ)
        return await self.store.length(peer.workspace, check_queue_name(queue_name))

    async def peek(self, queue_name: Any, n: Any = None, context: dict[str, Any] | None = None) -> list[Any]:
        """The ``n`` oldest tasks of a queue (oldest first), left in it."""
        peer = calling_peer()
        require(peer, peer.workspace, Permission.READ)
        name = check_queue_name(queue_name)
        return [json.loads(t) for t in await self.store.peek(peer.workspace, name, check_peek_count(n))]
