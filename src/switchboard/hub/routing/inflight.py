"""Calls in flight through this replica, so a drain can let them finish.

A call is a frame with a ``session`` to ``services.<svc>.<fn>``; it ends with
the callee's ``<session>.resolve`` or ``<session>.reject`` back to the caller
(which frame is which: :func:`switchboard.protocol.hypha.calls.classify`).
Only the peers of this replica are tracked (as caller, callee or both), and a
peer that leaves takes its entries with it, so nothing accumulates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class InFlight:
    """Open calls per local peer; ``on_change`` is called when one of them ends (a drain waits for that)."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        self._calls: dict[tuple[str, str], tuple[str, str]] = {}  # (caller, session) -> (caller, callee)
        self._opened_at: dict[tuple[str, str], int] = {}  # (caller, session) -> opening number
        self.opened_count = 0  # calls ever opened: a drain waits only for those opened before it
        self._by_peer: dict[str, set[tuple[str, str]]] = {}
        self._pending: dict[str, int] = {}  # open calls per caller
        self._to: dict[str, int] = {}  # open calls per local callee: its load (service selection's min_load)
        self._counted: set[tuple[str, str]] = set()  # the calls counted in _to

    def opened(self, caller: str, session: str, callee: str, local: set[str] | Any) -> None:
        key = (caller, session)
        if key not in self._calls:
            self._pending[caller] = self._pending.get(caller, 0) + 1
        else:
            self._unload(key, self._calls[key][1])
        self._calls[key] = (caller, callee)
        if callee in local:  # the callee's replica sees every call to it, wherever the caller is
            self._to[callee] = self._to.get(callee, 0) + 1
            self._counted.add(key)
        self.opened_count += 1
        self._opened_at[key] = self.opened_count
        for peer in (caller, callee):
            if peer in local:
                self._by_peer.setdefault(peer, set()).add(key)

    def closed(self, caller: str, session: str) -> None:
        pair = self._calls.pop((caller, session), None)
        self._opened_at.pop((caller, session), None)
        if pair is None:
            return
        self._unload((caller, session), pair[1])
        self._uncount(caller)
        for peer in pair:
            self._discard(peer, (caller, session))
        self._on_change()

    def forget_peer(self, peer: str) -> None:
        for key in self._by_peer.pop(peer, set()):
            pair = self._calls.pop(key, None)
            self._opened_at.pop(key, None)
            if pair:
                self._unload(key, pair[1])
                self._uncount(pair[0])
                for other in pair:
                    self._discard(other, key)
        self._on_change()

    def _discard(self, peer: str, key: tuple[str, str]) -> None:
        keys = self._by_peer.get(peer)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_peer[peer]

    def _unload(self, key: tuple[str, str], callee: str) -> None:
        if key not in self._counted:
            return
        self._counted.discard(key)
        left = self._to.get(callee, 0) - 1
        if left > 0:
            self._to[callee] = left
        else:
            self._to.pop(callee, None)

    def _uncount(self, caller: str) -> None:
        left = self._pending.get(caller, 0) - 1
        if left > 0:
            self._pending[caller] = left
        else:
            self._pending.pop(caller, None)

    def is_open(self, caller: str, session: str) -> bool:
        return (caller, session) in self._calls

    def load(self, callee: str) -> int:
        """Calls to ``callee``, a client of this replica, that wait for its reply."""
        return self._to.get(callee, 0)

    def loads(self, limit: int) -> dict[str, int]:
        """The ``limit`` most loaded clients of this replica with their open calls (none idle)."""
        if len(self._to) <= limit:
            return dict(self._to)
        return dict(sorted(self._to.items(), key=lambda item: item[1], reverse=True)[:limit])

    def pending(self, caller: str) -> int:
        """Calls ``caller`` made that still wait for a reply."""
        return self._pending.get(caller, 0)

    def busy_before(self, peer: str, cutoff: int) -> bool:
        """Is ``peer`` in a call (either side) opened before call number ``cutoff``?

        A drain waits only for those: a client that keeps calling would
        otherwise never be idle, and its later calls are retried elsewhere.
        """
        return any(self._opened_at.get(key, cutoff + 1) <= cutoff for key in self._by_peer.get(peer, ()))

    def waits_before(self, caller: str, cutoff: int) -> bool:
        """Does ``caller`` wait for a reply to a call opened before ``cutoff``?"""
        return any(
            key[0] == caller and self._opened_at.get(key, cutoff + 1) <= cutoff for key in self._by_peer.get(caller, ())
        )

    def busy(self, peer: str) -> bool:
        return peer in self._by_peer

    def __len__(self) -> int:
        return len(self._calls)
