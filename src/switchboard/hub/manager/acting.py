"""Whom the manager's RPC calls for, when it calls for an HTTP caller rather than as itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Acting:
    """Who the manager's RPC calls on behalf of (an HTTP caller), instead of as itself."""

    address: str
    workspace: str
    user: dict[str, Any]
