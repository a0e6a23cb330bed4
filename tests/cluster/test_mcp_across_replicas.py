"""A service on one replica used as an MCP server through the other (real processes, real Valkey)."""

from __future__ import annotations

from typing import Any

import pytest
from hypha_rpc.utils.schema import schema_function

from support.mcp_client import mcp_session, refusal
from support.tokens import credential

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@schema_function
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@schema_function
async def count(n: int) -> Any:
    """Yield the numbers below n."""
    for i in range(n):
        yield i


def whoami() -> Any:
    """A function of its own for each service (hypha-rpc files a function under the last service holding it)."""

    @schema_function
    def whoami(context: Any = None) -> str:
        """The id of the caller, as the hub tells the provider."""
        return str(context["user"]["id"])

    return whoami


async def test_an_mcp_client_at_one_replica_uses_a_service_on_the_other_as_itself(replicas, clients) -> None:
    a, b = replicas.start("ra"), replicas.start("rb")
    alice_token = credential("alice", 3600)[0]
    provider = await clients(b.url, client_id="prov", token=alice_token)  # the provider sits on replica B
    ws = provider.config["workspace"]
    public = {"visibility": "public"}
    await provider.register_service({"id": "pub", "config": public, "add": add, "count": count})
    await provider.register_service({"id": "who", "config": {**public, "require_context": True}, "whoami": whoami()})
    protected = {"visibility": "protected", "require_context": True}
    await provider.register_service({"id": "prot", "config": protected, "whoami": whoami()})

    seen: list[str | None] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async with mcp_session(f"{a.url}/{ws}/mcp/pub/mcp", credential("bob", 3600)[0]) as mcp:  # the agent at A
        assert {t.name for t in (await mcp.list_tools()).tools} == {"add", "count"}
        assert (await mcp.call_tool("add", {"a": 2, "b": 3})).content[0].text == "5"
        counted = await mcp.call_tool("count", {"n": 3}, progress_callback=progress)
        assert [c.text for c in counted.content] == ["0", "1", "2"]
    assert seen == ["0", "1", "2"]
    async with mcp_session(f"{a.url}/{ws}/mcp/who/mcp", credential("bob", 3600)[0]) as mcp:
        assert (await mcp.call_tool("whoami", {})).content[0].text == "bob"

    assert "Permission denied" in await refusal(f"{a.url}/{ws}/mcp/prot/mcp", credential("mallory", 3600)[0])
    async with mcp_session(f"{a.url}/{ws}/mcp/prot/mcp", alice_token) as mcp:
        assert (await mcp.call_tool("whoami", {})).content[0].text == "alice"
