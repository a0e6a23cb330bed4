"""Which wire version each other replica reads, as its presence record says.

A replica writes the newest version of the replica wire it reads
(:data:`~switchboard.protocol.link.replica_wire.VERSION`) in its presence
record, field :data:`FIELD`; the upkeep hands every round's records to
:meth:`PeerVersions.learn`, and the unicast (``replicas/dataplane/unicast.py``) asks :meth:`PeerVersions.reads`
before it writes a body to a link (:func:`~switchboard.protocol.link.replica_wire.over_link`).
A replica whose record names no version (a release before the field), or one
not seen yet, reads version 1: what every replica reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

FIELD: Final = "reads"  # in the presence record: the newest wire version the replica reads
_OLDEST: Final = 1
_MAX: Final = 255


def announced(record: Mapping[str, Any]) -> int:
    """The version a presence record says its replica reads: 1 unless it names a whole number from 1 to 255."""
    value = record.get(FIELD)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 3:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not _OLDEST <= value <= _MAX:
        return _OLDEST
    return value


class PeerVersions:
    """Replica id → the newest wire version it reads, as the last presence records read said."""

    def __init__(self) -> None:
        self._reads: dict[str, int] = {}

    def reads(self, replica_id: str) -> int:
        """The newest version ``replica_id`` reads; 1 if unknown (what every replica reads)."""
        return self._reads.get(replica_id, _OLDEST)

    def learn(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Every live replica's presence record, read now: the map is theirs alone (a replica
        gone, or back as an older release, is forgotten or downgraded)."""
        self._reads = {
            str(replica): version
            for record in records
            if (replica := record.get("id")) and (version := announced(record)) > _OLDEST
        }

    def __len__(self) -> int:
        return len(self._reads)

    def __repr__(self) -> str:
        return f"PeerVersions({self._reads!r})"
