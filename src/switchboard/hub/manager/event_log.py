"""The workspace event log: ``log_event``, ``get_events``, ``get_event_stats`` and ``log``.

Each workspace keeps its last :data:`MAX_LOG_ENTRIES` entries (a capped Redis
stream, a ring buffer on the embedded hub); older ones are dropped, so the log
is recent history, not an archive. As in Hypha, a caller reads back the
events its own user logged.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Protocol

import shortuuid

from switchboard.backends.base import WorkspaceStore
from switchboard.clock import Clock
from switchboard.errors import LimitExceeded, ProtocolError
from switchboard.hub.identity.users import Permission
from switchboard.hub.manager.data_charges import may_store, value_limit
from switchboard.hub.manager.manager_door import calling_peer
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha.values import plain

# Entries kept per workspace: a day of a busy application's milestones at one a minute,
# and small enough (x MAX_EVENT_DATA_BYTES) to keep per workspace in memory or Redis.
MAX_LOG_ENTRIES = 1000
# One entry's data as JSON: a log line or a small record, not a payload store.
MAX_EVENT_DATA_BYTES = 16 << 10
MAX_EVENT_TYPE_LENGTH = 128


class LogHost(Protocol):
    clock: Clock
    workspaces: WorkspaceStore


class EventLog:
    """The manager's event-log methods; ``keep``: whether a workspace's data is permanent."""

    def __init__(self, hub: LogHost, *, keep: Any, require: Any) -> None:
        self.hub = hub
        self.keep = keep
        self.require = require

    async def record(self, peer: Peer, event_type: str, data: Any) -> dict[str, Any]:
        """Append an entry by ``peer``'s user to its workspace's log (the caller checked the right)."""
        try:
            text = json.dumps(data)
        except (TypeError, ValueError):
            raise ProtocolError("event data must be JSON data (strings, numbers, lists, objects)") from None
        limit = value_limit(peer.workspace, MAX_EVENT_DATA_BYTES)
        if len(text.encode()) > limit:
            raise LimitExceeded(f"event data too large: at most {limit} bytes as JSON")
        now = self.hub.clock.time()
        entry = {
            "id": shortuuid.uuid()[:16],
            "event_type": event_type,
            "workspace": peer.workspace,
            "user_id": peer.user.id,
            "timestamp": _iso(now),
            "data": data,
            "ts": now,
        }
        await self.hub.workspaces.log_append(
            peer.workspace, json.dumps(entry), max_entries=MAX_LOG_ENTRIES, keep=await self.keep(peer.workspace)
        )
        return entry

    async def log_event(self, event_type: Any, data: Any = None, context: dict[str, Any] | None = None) -> None:
        """Log an event in the caller's workspace."""
        peer = calling_peer()
        await self.require(peer, peer.workspace, Permission.READ_WRITE)
        may_store(peer.user, peer.workspace)
        if not isinstance(event_type, str) or not 0 < len(event_type) <= MAX_EVENT_TYPE_LENGTH or " " in event_type:
            raise ProtocolError(f"Event type must be a string of 1 to {MAX_EVENT_TYPE_LENGTH} characters, no spaces")
        await self.record(peer, event_type, plain(data))

    async def log(self, msg: Any, context: dict[str, Any] | None = None) -> None:
        """Write a line to the server log and to the workspace's event log (type ``log``)."""
        peer = calling_peer()
        await self.require(peer, peer.workspace, Permission.READ_WRITE)
        may_store(peer.user, peer.workspace)
        peer.log.info("client log: %.1000s", msg)
        await self.record(peer, "log", plain(msg))

    async def get_events(
        self,
        event_type: Any = None,
        start_time: Any = None,
        end_time: Any = None,
        context: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """The caller's events in its workspace, oldest first, filtered by type and time."""
        return [{k: v for k, v in e.items() if k != "ts"} for e in await self._select(event_type, start_time, end_time)]

    async def get_event_stats(
        self,
        event_type: Any = None,
        start_time: Any = None,
        end_time: Any = None,
        context: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """How many of the caller's events of each type its workspace's log holds."""
        counts: dict[str, int] = {}
        for e in await self._select(event_type, start_time, end_time):
            counts[e["event_type"]] = counts.get(e["event_type"], 0) + 1
        return [{"event_type": t, "count": n} for t, n in counts.items()]

    async def _select(self, event_type: Any, start_time: Any, end_time: Any) -> list[dict[str, Any]]:
        peer = calling_peer()
        await self.require(peer, peer.workspace, Permission.READ)
        if event_type is not None and not isinstance(event_type, str):
            raise ProtocolError("event_type must be a string")
        start, end = _time(start_time, "start_time"), _time(end_time, "end_time")
        found = []
        for raw in await self.hub.workspaces.log_entries(peer.workspace, MAX_LOG_ENTRIES):
            e = json.loads(raw)
            if e.get("user_id") != peer.user.id or (event_type and e.get("event_type") != event_type):
                continue
            if (start is not None and e["ts"] < start) or (end is not None and e["ts"] > end):
                continue
            found.append(e)
        return found


def _time(value: Any, what: str) -> float | None:
    """Seconds since the epoch from a number or an ISO time (naive = UTC, as Hypha's)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            return (when if when.tzinfo else when.replace(tzinfo=datetime.UTC)).timestamp()
    raise ProtocolError(f"{what} must be an ISO time or seconds since the epoch")


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).replace(tzinfo=None).isoformat()
