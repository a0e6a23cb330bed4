"""An agent's side of MCP: the official ``mcp`` client SDK over Streamable HTTP, with a bearer token."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError


@contextlib.asynccontextmanager
async def mcp_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with (
        create_mcp_http_client(headers=headers, timeout=httpx2.Timeout(20)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def refusal(url: str, token: str | None = None) -> str:
    """The error an MCP client meets when it connects to ``url``, or ``""`` if it gets in."""
    try:
        async with mcp_session(url, token):
            return ""
    except MCPError as exc:
        return str(exc)
    except BaseExceptionGroup as group:
        matched, _ = group.split(MCPError)
        if matched is None:
            raise
        while isinstance(matched, BaseExceptionGroup):
            matched = matched.exceptions[0]
        return str(matched)
