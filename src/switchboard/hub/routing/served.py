"""Balanced calls an instance of this replica took from a caller's replica elsewhere, without I/O.

hypha-rpc takes the answer to a call (and its callbacks' calls) only from the
target it called: the handle, ``<ws>/balance|<policy>|<name>``. The caller's
replica relabels what the instance sends back (:meth:`Balanced.relabel`), but a
caller that moves to another replica while its call runs leaves that table
behind. So a balanced call that crosses to the instance's replica travels with
its handle (:class:`~switchboard.protocol.link.replica_wire.BalancedCall`, marked in
the bus's origin tag, which only replicas write), and the instance's replica relabels the instance's frames of
that session as they leave it, wherever the caller is by then.
"""

from __future__ import annotations

# Balanced calls remembered at once (an entry goes with the call's answer); beyond, the oldest
# is forgotten: its answer then leaves unlabelled, and the caller's replica labels it if it can.
MAX_SERVED = 100_000


class ServedHandles:
    """(caller, session) → (instance, handle) of balanced calls running on instances here."""

    def __init__(self, limit: int = MAX_SERVED) -> None:
        self.limit = limit
        self._calls: dict[tuple[str, str], tuple[str, str]] = {}

    def took(self, instance: str, caller: str, session: str, handle: str) -> None:
        if len(self._calls) >= self.limit:
            self._calls.pop(next(iter(self._calls)))
        self._calls[(caller, session)] = (instance, handle)

    def relabel(self, caller: str, method: object, sender: object) -> str | None:
        """The handle a frame ``sender`` sends ``caller`` within one of these calls' session comes
        from; ``None``: not such a frame (another sender may not speak for the handle)."""
        if not self._calls or not isinstance(method, str):
            return None
        entry = self._calls.get((caller, method.rpartition(".")[0]))
        return entry[1] if entry is not None and entry[0] == sender else None

    def closed(self, caller: str, session: str) -> None:
        self._calls.pop((caller, session), None)

    def __len__(self) -> int:
        return len(self._calls)
