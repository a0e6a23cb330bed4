"""Placeholders for ``hypha.admin``: Hypha's admin terminal is its server's code."""

from __future__ import annotations

from typing import Any

from hypha import HyphaInternals, internal

AdminTerminal = internal("hypha.admin.AdminTerminal")


async def setup_admin_services(*args: Any, **kwargs: Any) -> Any:
    raise HyphaInternals("hypha.admin.setup_admin_services is Hypha's server code, not part of a hub")
