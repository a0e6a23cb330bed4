"""Services as MCP servers, spoken to by the official ``mcp`` client SDK as an agent would.

``/{workspace}/mcp/{service_id}/mcp`` serves a service registered by a real
hypha-rpc client; each request is an HTTP call of its caller (the bearer
token's, anonymous without one), with the rules of ``/{workspace}/services``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server
from hypha_rpc.utils.schema import schema_function
from mcp.shared.exceptions import MCPError

from support.mcp_client import mcp_session, refusal
from support.tokens import credential
from switchboard.config import Settings
from switchboard.server.runner import RunningServer
from switchboard.testing.hub import running
from switchboard.testing.hub import settings_for_tests as make_settings

pytestmark = pytest.mark.timeout(60)

MAX_BODY = 256 * 1024


@pytest.fixture
def settings() -> Settings:
    return make_settings(max_message_bytes=MAX_BODY)


@schema_function
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@schema_function
def fail(message: str) -> None:
    """Always fails with the message."""
    raise ValueError(message)


@schema_function
async def count(n: int) -> Any:
    """Yield the numbers below n."""
    for i in range(n):
        yield i


@schema_function
def big(size: int) -> str:
    """A text of size characters."""
    return "x" * size


def whoami() -> Any:
    """A function of its own for each service (hypha-rpc files a function under the last service holding it)."""

    @schema_function
    def whoami(context: Any = None) -> str:
        """The id of the caller, as the hub tells the provider."""
        return str(context["user"]["id"])

    return whoami


class Alice:
    def __init__(self, api: Any, token: str) -> None:
        self.api, self.token = api, token
        self.ws: str = api.config["workspace"]


@pytest.fixture
async def alice(connect: Any) -> Alice:
    token = credential("alice", 3600)[0]
    api = await connect(client_id="prov", token=token)
    tools = {"add": add, "fail": fail, "count": count, "big": big, "nested": {"add": add}}
    await api.register_service({"id": "pub", "config": {"visibility": "public"}, "docs": "How to add.", **tools})
    await api.register_service(
        {"id": "prot", "config": {"visibility": "protected", "require_context": True}, "whoami": whoami()}
    )
    await api.register_service(
        {"id": "who", "config": {"visibility": "public", "require_context": True}, "whoami": whoami()}
    )
    return Alice(api, token)


def endpoint(server: RunningServer, ws: str, service: str) -> str:
    return f"{server.url}/{ws}/mcp/{service}/mcp"


async def test_a_services_functions_are_tools_named_and_described_by_their_schema(server, alice) -> None:
    async with mcp_session(endpoint(server, alice.ws, "pub")) as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
    assert set(tools) == {"add", "fail", "count", "big", "nested_add"}
    assert tools["add"].description == "Add two integers."
    assert tools["add"].input_schema["properties"]["a"]["type"] == "integer"
    assert tools["add"].input_schema["required"] == ["a", "b"]


async def test_a_tool_call_passes_its_arguments_and_answers_the_result(server, alice) -> None:
    async with mcp_session(endpoint(server, alice.ws, "pub")) as mcp:
        done = await mcp.call_tool("nested_add", {"a": 2, "b": 40})
    assert not done.is_error
    assert done.content[0].text == "42"


async def test_a_failing_function_is_a_tool_error_the_agent_reads(server, alice) -> None:
    async with mcp_session(endpoint(server, alice.ws, "pub")) as mcp:
        done = await mcp.call_tool("fail", {"message": "no luck"})
        assert done.is_error
        assert "no luck" in done.content[0].text
        with pytest.raises(MCPError, match="Unknown tool"):
            await mcp.call_tool("nope", {})


async def test_a_generator_streams_its_items_as_progress_and_answers_them_all(server, alice) -> None:
    seen: list[str | None] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async with mcp_session(endpoint(server, alice.ws, "pub")) as mcp:
        done = await mcp.call_tool("count", {"n": 4}, progress_callback=progress)
    assert [c.text for c in done.content] == ["0", "1", "2", "3"]
    assert seen == ["0", "1", "2", "3"]


async def test_a_large_result_arrives_whole(server, alice) -> None:
    async with mcp_session(endpoint(server, alice.ws, "pub")) as mcp:
        done = await mcp.call_tool("big", {"size": 200_000})
    assert done.content[0].text == "x" * 200_000


async def test_string_fields_are_resources(server, alice) -> None:
    async with mcp_session(endpoint(server, alice.ws, "pub")) as mcp:
        listed = [str(r.uri) for r in (await mcp.list_resources()).resources]
        read = await mcp.read_resource("resource://docs")
    assert listed == ["resource://docs"]
    assert read.contents[0].text == "How to add."


async def test_a_protected_service_is_refused_to_an_outsider_and_served_to_its_owner(server, alice) -> None:
    url = endpoint(server, alice.ws, "prot")
    for token in (None, credential("mallory", 3600)[0]):
        assert "Permission denied" in await refusal(url, token)
    async with mcp_session(url, alice.token) as mcp:
        done = await mcp.call_tool("whoami", {})
    assert done.content[0].text == "alice"


async def test_a_tool_runs_as_its_caller_and_no_one_else(server, alice) -> None:
    url = endpoint(server, alice.ws, "who")
    async with mcp_session(url, credential("bob", 3600)[0]) as mcp:
        as_bob = await mcp.call_tool("whoami", {})
    async with mcp_session(url) as mcp:
        as_anonymous = await mcp.call_tool("whoami", {})
    assert as_bob.content[0].text == "bob"
    assert as_anonymous.content[0].text.startswith("anonymouz-")  # not the provider's, not the hub's


async def test_a_body_above_the_message_limit_is_refused_before_the_call(server, alice) -> None:
    async with mcp_session(endpoint(server, alice.ws, "pub")) as mcp:
        with pytest.raises(MCPError, match="above the limit"):
            await mcp.call_tool("big", {"size": 1, "pad": "y" * (MAX_BODY + 1)})


async def test_a_service_describes_its_endpoint_and_tools_to_whoever_may_use_it(server, alice) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        public = await http.get(f"/{alice.ws}/mcp/pub")
        protected = await http.get(f"/{alice.ws}/mcp/prot")
        owned = await http.get(f"/{alice.ws}/mcp/prot", headers={"Authorization": f"Bearer {alice.token}"})
    assert public.status_code == 200
    assert public.json()["endpoints"]["streamable_http"] == f"/{alice.ws}/mcp/pub/mcp"
    assert "add" in {t["name"] for t in public.json()["capabilities"]["tools"]}
    assert protected.status_code == 403
    assert [t["name"] for t in owned.json()["capabilities"]["tools"]] == ["whoami"]


async def test_what_is_not_an_mcp_request_gets_a_clear_error(server, alice) -> None:
    url = endpoint(server, alice.ws, "pub")
    async with httpx.AsyncClient(timeout=10) as http:
        garbage = await http.post(url, content=b"{not json")
        batch = await http.post(url, json=[{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
        unknown = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/run"})
        stream = await http.get(url)
    assert (garbage.status_code, garbage.json()["error"]["code"]) == (400, -32700)
    assert (batch.status_code, batch.json()["error"]["code"]) == (400, -32600)
    assert unknown.json() == {
        "jsonrpc": "2.0",
        "id": 2,
        "error": {"code": -32601, "message": "Method not found: tools/run"},
    }
    assert stream.status_code == 405  # no stream of the server's own: answers ride their requests


async def test_requests_past_the_callers_rate_are_refused_fast_with_429() -> None:
    """Anonymous requests from one address are one caller, as on /{workspace}/services: past its burst, 429."""
    async with running(make_settings(max_messages_per_second=1, message_burst=20)) as srv:
        provider = await connect_to_server({"server_url": srv.url, "client_id": "prov"})
        try:
            await provider.register_service({"id": "pub", "config": {"visibility": "public"}, "add": add})
            url = endpoint(srv, provider.config["workspace"], "pub")
            ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            async with httpx.AsyncClient(timeout=10) as http:
                answers = [await http.post(url, json=ping) for _ in range(30)]
        finally:
            await provider.disconnect()
    codes = [a.status_code for a in answers]
    assert codes[0] == 200
    assert 429 in codes, codes
    refused = answers[codes.index(429)]
    assert int(refused.headers["Retry-After"]) >= 1
    assert "rate" in refused.json()["error"]["message"].lower()


@pytest.fixture
async def inline(connect: Any) -> str:
    api = await connect(client_id="inline")

    @schema_function
    def read_notes() -> str:
        """The notes."""
        return "remember the milk"

    @schema_function
    def greet(name: str) -> str:
        """A greeting prompt."""
        return f"Say hello to {name}"

    await api.register_service(
        {
            "id": "kit",
            "type": "mcp",
            "config": {"visibility": "public"},
            "tools": {"add": add},
            "resources": {"notes": {"uri": "resource://notes", "name": "Notes", "read": read_notes}},
            "prompts": {"greet": {"name": "greet", "description": "Greets", "read": greet}},
        }
    )
    ws: str = api.config["workspace"]
    return ws


async def test_an_mcp_service_offers_its_tools_resources_and_prompts(server, inline) -> None:
    async with mcp_session(endpoint(server, inline, "kit")) as mcp:
        assert [t.name for t in (await mcp.list_tools()).tools] == ["add"]
        assert (await mcp.call_tool("add", {"a": 1, "b": 2})).content[0].text == "3"
        assert (await mcp.read_resource("resource://notes")).contents[0].text == "remember the milk"
        prompts = (await mcp.list_prompts()).prompts
        assert [(p.name, [a.name for a in p.arguments or []]) for p in prompts] == [("greet", ["name"])]
        got = await mcp.get_prompt("greet", {"name": "Ada"})
    assert got.messages[0].content.text == "Say hello to Ada"


async def test_a_service_answering_mcp_itself_is_forwarded_its_requests(server, connect) -> None:
    api = await connect(client_id="native")

    def call_tool(name: str, arguments: dict[str, Any]) -> Any:
        if name != "shout":
            raise ValueError(f"no tool {name}")
        return [{"type": "text", "text": arguments["text"].upper()}]

    tool = {"name": "shout", "description": "Upper-case a text.", "inputSchema": {"type": "object"}}
    await api.register_service(
        {
            "id": "native",
            "type": "mcp",
            "config": {"visibility": "public"},
            "list_tools": lambda: [tool],
            "call_tool": call_tool,
            "list_resources": lambda: [{"uri": "resource://motd", "name": "motd"}],
            "read_resource": lambda uri: {"contents": [{"uri": uri, "text": "hello"}]},
        }
    )
    async with mcp_session(endpoint(server, api.config["workspace"], "native")) as mcp:
        assert [(t.name, t.description) for t in (await mcp.list_tools()).tools] == [("shout", "Upper-case a text.")]
        assert (await mcp.call_tool("shout", {"text": "hi"})).content[0].text == "HI"
        failed = await mcp.call_tool("whisper", {})
        assert failed.is_error
        assert "no tool whisper" in failed.content[0].text
        assert [str(r.uri) for r in (await mcp.list_resources()).resources] == ["resource://motd"]
        assert (await mcp.read_resource("resource://motd")).contents[0].text == "hello"


async def test_the_workspace_endpoint_lists_the_services_its_caller_may_use(server, alice) -> None:
    async with mcp_session(f"{server.url}/{alice.ws}/mcp") as mcp:
        assert [t.name for t in (await mcp.list_tools()).tools] == ["list_services"]
        outsider = (await mcp.call_tool("list_services", {})).structured_content
    async with mcp_session(f"{server.url}/{alice.ws}/mcp", alice.token) as mcp:
        owner = (await mcp.call_tool("list_services", {})).structured_content
    assert outsider is not None
    assert owner is not None
    names = {s["id"].rpartition(":")[2] for s in outsider["services"]}
    assert "pub" in names
    assert "prot" not in names
    assert "prot" in {s["id"].rpartition(":")[2] for s in owner["services"]}
    pub = next(s for s in outsider["services"] if s["id"].endswith(":pub"))
    assert pub["mcp_url"].endswith(f"/{alice.ws}/mcp/prov:pub/mcp")
