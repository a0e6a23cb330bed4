"""HTTP streaming RPC transport (protocol §8.4). Filled in below."""

from __future__ import annotations

from starlette.routing import Route


def routes() -> list[Route]:
    return []
