"""Entries that expire, each charged to a principal, bounded per principal and in all: the embedded
hub's revocations and deletion marks.

Each entry is also filed under the whole second it expires in; every
addition first drops the seconds that have passed since the last one (each
entry is dropped once, so the work is paid for by the additions that made
the entries), then adds one: constant work per addition, never a walk over
every entry.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from switchboard.clock import Clock

Refusal = Literal["principal", "total"]


@dataclass(slots=True)
class _Entry:
    until: float
    principal: str
    value: float


class ChargedExpiries:
    """At most ``per_principal`` live entries per principal and ``total`` in all, on ``clock``'s wall time."""

    def __init__(self, clock: Clock, *, per_principal: int, total: int) -> None:
        self.clock = clock
        self.per_principal = per_principal
        self.total = total
        self._entries: dict[str, _Entry] = {}
        self._by_second: dict[int, list[str]] = {}  # ceil(until) -> keys expiring in that second
        self._held: dict[str, int] = {}  # principal -> live entries charged to it
        self._swept = math.ceil(clock.time())  # every second before this one was dropped

    def add(self, key: str, *, until: float, principal: str, value: float = 0.0) -> Refusal | None:
        """Keep ``key`` (with ``value``) until ``until``, charged to ``principal``; which bound refused it,
        if one did (then nothing is kept). A key kept already is kept until the later of the two, with
        the new value, charged as before."""
        now = self.clock.time()
        self._drop_expired(now)
        if until <= now:
            return None  # expired already: nothing to keep
        entry = self._entries.get(key)
        if entry is not None:
            entry.value = value
            if until > entry.until:  # filed under its new second too
                entry.until = until
                self._by_second.setdefault(math.ceil(until), []).append(key)
            return None
        if self._held.get(principal, 0) >= self.per_principal:
            return "principal"
        if len(self._entries) >= self.total:
            return "total"
        self._entries[key] = _Entry(until, principal, value)
        self._by_second.setdefault(math.ceil(until), []).append(key)
        self._held[principal] = self._held.get(principal, 0) + 1
        return None

    def get(self, key: str) -> float | None:
        """The value of ``key`` if it is kept and has not expired."""
        entry = self._entries.get(key)
        return entry.value if entry is not None and entry.until > self.clock.time() else None

    def held_by(self, principal: str) -> int:
        """Entries charged to ``principal`` (the expired not yet dropped among them)."""
        return self._held.get(principal, 0)

    def __len__(self) -> int:
        """Entries kept, the expired not yet dropped among them."""
        return len(self._entries)

    def _drop_expired(self, now: float) -> None:
        last = math.floor(now)  # a second ``s`` holds entries with until <= s: expired once s <= now
        if last < self._swept:
            return
        due: Iterable[int] = range(self._swept, last + 1)  # walk the seconds passed
        if last - self._swept >= len(self._by_second):  # long idle: fewer seconds are filed than have passed
            due = sorted(s for s in self._by_second if s <= last)
        for second in due:
            for key in self._by_second.pop(second, ()):
                entry = self._entries.get(key)
                if entry is not None and math.ceil(entry.until) == second:
                    del self._entries[key]
                    left = self._held[entry.principal] - 1
                    if left:
                        self._held[entry.principal] = left
                    else:
                        del self._held[entry.principal]
        self._swept = last + 1
