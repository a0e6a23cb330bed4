"""Switchboard: an RPC and event hub, wire-compatible with hypha-rpc clients."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # ``switchboard.connect`` without making ``import switchboard`` load the client stack
    if name == "connect":
        from switchboard.client import connect

        return connect
    raise AttributeError(f"module 'switchboard' has no attribute {name!r}")
