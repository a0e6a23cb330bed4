"""A service that answers MCP's requests itself: each request forwarded to its function (no I/O of its own)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from switchboard.errors import JsonRpcError
from switchboard.server.http import mcp_tools
from switchboard.server.http.http_errors import status_of
from switchboard.server.http.http_services import jsonable

Handler = Callable[[dict[str, Any]], Awaitable[Any]]
"""One MCP method: its ``params`` in, its ``result`` out."""


def methods(service: Any, call: Callable[..., Awaitable[Any]]) -> dict[str, Handler]:
    """A service answering MCP's requests itself (``list_tools``, ``call_tool``, ...), as Hypha forwards them."""

    def forward(function: str, shape: Callable[[dict[str, Any], Any], Any], *keys: str) -> Handler:
        async def handler(params: dict[str, Any]) -> Any:
            kwargs = {k: params.get(k) or ({} if k == "arguments" else None) for k in keys}
            try:
                value = await call((function,), kwargs)
            except JsonRpcError:
                raise
            except Exception as exc:
                if function != "call_tool":
                    raise
                return {"content": [{"type": "text", "text": status_of(exc)[1]}], "isError": True}
            return shape(params, jsonable(value))

        return handler

    def listed(kind: str) -> Callable[[dict[str, Any], Any], Any]:
        return lambda params, value: {kind: value if isinstance(value, list) else []}

    def tool_result(params: dict[str, Any], value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("content"), list):
            return value
        return {"content": mcp_tools.content(value), "isError": False}

    def resource(params: dict[str, Any], value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("contents"), list):
            return value
        uri = str(params.get("uri"))
        return mcp_tools.resource_result(
            mcp_tools.ReadableEntry(uri, {"uri": uri, "mimeType": "text/plain"}, None), value
        )

    table = {
        "list_tools": ("tools/list", listed("tools"), ()),
        "call_tool": ("tools/call", tool_result, ("name", "arguments")),
        "list_resources": ("resources/list", listed("resources"), ()),
        "list_resource_templates": ("resources/templates/list", listed("resourceTemplates"), ()),
        "read_resource": ("resources/read", resource, ("uri",)),
        "list_prompts": ("prompts/list", listed("prompts"), ()),
        "get_prompt": (
            "prompts/get",
            lambda p, v: mcp_tools.prompt_result(str(p.get("name")), v),
            ("name", "arguments"),
        ),
    }
    return {
        method: forward(function, shape, *keys)
        for function, (method, shape, keys) in table.items()
        if callable(service.get(function))
    }
