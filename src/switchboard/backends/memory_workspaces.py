"""Workspace records and their data in one process (the embedded hub's :class:`WorkspaceStore`).

Records last while the process runs, except persistent ones, which a
``path`` keeps in a file (the hub's state directory: an append-only log,
:mod:`switchboard.backends.record_log`) so they survive a restart. Tables and
logs live in memory only.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchboard.backends.record_log import RecordLog
from switchboard.clock import Clock, SystemClock


@dataclass
class _Data:
    tables: dict[str, dict[str, str]] = field(default_factory=dict)
    log: deque[str] = field(default_factory=deque)
    keep: bool = False
    deadline: float = 0.0


class MemoryWorkspaceStore:
    """Records in a dict; data per workspace in an ``OrderedDict`` by last write, so the
    data of workspaces without a persistent record can be dropped from the front once
    ``ttl`` seconds passed since their last write."""

    def __init__(self, *, clock: Clock | None = None, ttl: float, path: Path | None = None) -> None:
        self._clock = clock or SystemClock()
        self._ttl = ttl
        self._records: dict[str, dict[str, Any]] = {}
        self._data: OrderedDict[str, _Data] = OrderedDict()  # expiring, oldest write first
        self._kept: dict[str, _Data] = {}  # of persistent workspaces
        self._deleted: dict[str, tuple[float, float]] = {}  # workspace -> (when deleted, kept until), epoch s
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
        self._data.pop(workspace, None)
        self._kept.pop(workspace, None)
        record = self._records.pop(workspace, None)
        if self._disk is not None and record is not None and record.get("persistent"):
            self._disk.remove(workspace)
        return record

    async def records(self, limit: int) -> list[dict[str, Any]]:
        return list(self._records.values())[:limit]

    async def table_set(
        self, workspace: str, table: str, key: str, value: str | None, *, max_entries: int, keep: bool, only_new: bool
    ) -> bool:
        entries = self._touch(workspace, keep).tables.setdefault(table, {})
        if value is None:
            entries.pop(key, None)
            return True
        if key in entries and only_new:
            return False
        if key not in entries and len(entries) >= max_entries:
            return False
        entries[key] = value
        return True

    async def table(self, workspace: str, table: str) -> dict[str, str]:
        data = self._live(workspace)
        return dict(data.tables.get(table, {})) if data else {}

    async def log_append(self, workspace: str, entry: str, *, max_entries: int, keep: bool) -> None:
        log = self._touch(workspace, keep).log
        log.append(entry)
        while len(log) > max_entries:
            log.popleft()

    async def log_entries(self, workspace: str, limit: int) -> list[str]:
        data = self._live(workspace)
        return list(data.log)[-limit:] if data else []

    async def mark_deleted(self, workspace: str, at: float, *, ttl: float) -> None:
        now = self._clock.time()
        self._deleted = {w: v for w, v in self._deleted.items() if v[1] > now}  # expired ones go
        self._deleted[workspace] = (at, now + ttl)

    async def deleted_at(self, workspace: str) -> float | None:
        found = self._deleted.get(workspace)
        return found[0] if found is not None and found[1] > self._clock.time() else None

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
            self._data.popitem(last=False)
        data = self._data.pop(workspace, None) or _Data()
        data.deadline = now + self._ttl
        if keep:
            data.keep = True
            self._kept[workspace] = data
        else:
            self._data[workspace] = data
        return data

    def _persistent(self) -> list[dict[str, Any]]:
        return [r for r in self._records.values() if r.get("persistent")]

    def __repr__(self) -> str:
        return f"MemoryWorkspaceStore(records={len(self._records)}, with_data={len(self._data) + len(self._kept)})"
