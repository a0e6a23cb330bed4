"""Decoded RPC values as plain data."""

from __future__ import annotations

from typing import Any


def plain(value: Any) -> Any:
    """Decoded values arrive as Munch/ObjectProxy: turn them into plain data."""
    if hasattr(value, "toDict"):
        value = value.toDict()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
