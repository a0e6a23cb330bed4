"""Workspace records and their data in one process (the embedded hub's :class:`WorkspaceStore`).

Records last while the process runs, except persistent ones, which a
``path`` keeps in a file (the hub's state directory: an append-only log,
:mod:`switchboard.backends.record_log`) so they survive a restart. Tables and
logs live in memory only, at most ``max_bytes`` of them in all: a write past it
is refused with :class:`LimitExceeded`.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchboard.backends.base import (
    MAX_DELETIONS,
    MAX_DELETIONS_PER_PRINCIPAL,
    deletions_full,
    workspace_data_full,
)
from switchboard.backends.expiring import ChargedExpiries
from switchboard.backends.record_log import RecordLog
from switchboard.clock import Clock, SystemClock


@dataclass
class _Data:
    tables: dict[str, dict[str, str]] = field(default_factory=dict)
    log: deque[str] = field(default_factory=deque)
    keep: bool = False
    deadline: float = 0.0
    size: int = 0  # characters of its keys, values and log entries


class MemoryWorkspaceStore:
    """Records in a dict; data per workspace in an ``OrderedDict`` by last write, so the
    data of workspaces without a persistent record can be dropped from the front once
    ``ttl`` seconds passed since their last write."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        ttl: float,
        path: Path | None = None,
        max_bytes: int | None = None,
        deletions_per_principal: int = MAX_DELETIONS_PER_PRINCIPAL,
        deletions: int = MAX_DELETIONS,
    ) -> None:
        self._clock = clock or SystemClock()
        self._ttl = ttl
        self.max_bytes = max_bytes
        self.held_bytes = 0  # of every workspace's tables and logs (expired ones not yet dropped among them)
        self._records: dict[str, dict[str, Any]] = {}
        self._data: OrderedDict[str, _Data] = OrderedDict()  # expiring, oldest write first
        self._kept: dict[str, _Data] = {}  # of persistent workspaces
        # workspace -> when it was deleted (epoch s), kept for the tombstone's ttl
        self._deleted = ChargedExpiries(self._clock, per_principal=deletions_per_principal, total=deletions)
        self._disk = None if path is None else RecordLog(path, self._persistent)
        if self._disk is not None:
            self._records = self._disk.load()

    async def get(self, workspace: str) -> dict[str, Any] | None:
        return self._records.get(workspace)

    async def put(self, record: dict[str, Any], *, overwrite: bool) -> bool:
        ws = record["id"]
        if ws in self._records and not overwrite:
            return False
        was_kept = bool(self._records.get(ws, {}).get("persistent"))
        self._records[ws] = json.loads(json.dumps(record))
        data = self._data.pop(ws, None)
        if data is not None and record.get("persistent"):
            data.keep = True
            self._kept[ws] = data
        elif data is not None:
            self._data[ws] = data
        if self._disk is not None and record.get("persistent"):
            self._disk.put(self._records[ws])
        elif self._disk is not None and was_kept:
            self._disk.remove(ws)
        return True

    async def remove(self, workspace: str) -> dict[str, Any] | None:
        for data in (self._data.pop(workspace, None), self._kept.pop(workspace, None)):
            self.held_bytes -= data.size if data is not None else 0
        record = self._records.pop(workspace, None)
        if self._disk is not None and record is not None and record.get("persistent"):
            self._disk.remove(workspace)
        return record

    async def records(self, limit: int) -> list[dict[str, Any]]:
        return list(self._records.values())[:limit]

    async def table_set(
        self, workspace: str, table: str, key: str, value: str | None, *, max_entries: int, keep: bool, only_new: bool
    ) -> bool:
        data = self._touch(workspace, keep)
        entries = data.tables.setdefault(table, {})
        old = entries.get(key)
        if value is None:
            if old is not None:
                del entries[key]
                self._grow(data, -len(key) - len(old))
            return True
        if old is not None and only_new:
            return False
        if old is None and len(entries) >= max_entries:
            return False
        self._grow(data, len(value) - len(old) if old is not None else len(key) + len(value))
        entries[key] = value
        return True

    async def table(self, workspace: str, table: str) -> dict[str, str]:
        data = self._live(workspace)
        return dict(data.tables.get(table, {})) if data else {}

    async def log_append(self, workspace: str, entry: str, *, max_entries: int, keep: bool) -> None:
        data = self._touch(workspace, keep)
        self._grow(data, len(entry))
        data.log.append(entry)
        while len(data.log) > max_entries:
            self._grow(data, -len(data.log.popleft()))

    async def log_entries(self, workspace: str, limit: int) -> list[str]:
        data = self._live(workspace)
        return list(data.log)[-limit:] if data else []

    async def mark_deleted(self, workspace: str, at: float, *, ttl: float, principal: str) -> None:
        refused = self._deleted.add(workspace, until=self._clock.time() + ttl, principal=principal, value=at)
        if refused == "principal":
            raise deletions_full(principal, self._deleted.per_principal)
        if refused == "total":
            raise deletions_full(None, self._deleted.total)

    async def deleted_at(self, workspace: str) -> float | None:
        return self._deleted.get(workspace)

    def _live(self, workspace: str) -> _Data | None:
        if workspace in self._kept:
            return self._kept[workspace]
        data = self._data.get(workspace)
        if data is not None and data.deadline <= self._clock.monotonic():
            return None
        return data

    def _touch(self, workspace: str, keep: bool) -> _Data:
        """The workspace's data, moved to the back as the latest written; expired data dropped first."""
        if workspace in self._kept:
            return self._kept[workspace]
        now = self._clock.monotonic()
        while self._data and next(iter(self._data.values())).deadline <= now:
            self.held_bytes -= self._data.popitem(last=False)[1].size
        data = self._data.pop(workspace, None) or _Data()
        data.deadline = now + self._ttl
        if keep:
            data.keep = True
            self._kept[workspace] = data
        else:
            self._data[workspace] = data
        return data

    def _grow(self, data: _Data, by: int) -> None:
        """Count ``by`` more characters in ``data``; refused (nothing counted) past ``max_bytes`` in all."""
        if by > 0 and self.max_bytes is not None and self.held_bytes + by > self.max_bytes:
            raise workspace_data_full(self.max_bytes)
        data.size += by
        self.held_bytes += by

    def _persistent(self) -> list[dict[str, Any]]:
        return [r for r in self._records.values() if r.get("persistent")]

    def __repr__(self) -> str:
        with_data = len(self._data) + len(self._kept)
        return f"MemoryWorkspaceStore(records={len(self._records)}, with_data={with_data}, bytes={self.held_bytes})"
