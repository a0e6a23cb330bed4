"""Decoded RPC values as plain data."""

from __future__ import annotations

from typing import Any

# What msgpack decodes to and needs no conversion: returned as they are, before asking for ``toDict``
# (a failed attribute lookup per leaf was most of the cost of a registration's few hundred values).
_LEAVES = frozenset({str, int, float, bool, bytes, type(None)})


def plain(value: Any) -> Any:
    """Decoded values arrive as Munch/ObjectProxy: turn them into plain data."""
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind is dict:
        return {k: plain(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [plain(v) for v in value]
    if hasattr(value, "toDict"):
        value = value.toDict()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
