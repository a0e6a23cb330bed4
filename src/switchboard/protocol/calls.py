"""Which frames are calls: a pure rule shared by the hub's bookkeeping and the replica layer's replays."""

from __future__ import annotations

from typing import Any

from switchboard.protocol.chunks import MESSAGE_CACHE


def is_call(method: Any, session: str | None) -> bool:
    """A call that starts work: chunk transfers are plumbing, not calls of their own."""
    return (
        bool(session)
        and isinstance(method, str)
        and method.startswith("services.")
        and not method.startswith(MESSAGE_CACHE)
    )
