"""What a service shows an MCP client, decided without I/O (``server/http/mcp_tools.py``)."""

from __future__ import annotations

import pytest

from switchboard.errors import RequestRefused
from switchboard.server.http import mcp_tools


def _fn(name: str, description: str = "") -> dict[str, object]:
    parameters = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def test_nested_functions_are_tools_named_by_their_path_and_private_ones_are_not() -> None:
    info = {"id": "ws/c:s", "service_schema": {"add": _fn("add", "Adds."), "m": {"sub": _fn("sub")}, "_x": _fn("x")}}
    found = mcp_tools.catalog({"docs": "Read me.", "version": "1.0", "config": {"x": "y"}}, info)
    assert {n: t.path for n, t in found.tools.items()} == {"add": ("add",), "m_sub": ("m", "sub")}
    assert found.tools["add"].listed()["description"] == "Adds."
    assert found.tools["m_sub"].listed()["description"] == "Function m_sub"  # no description: Hypha's words
    assert set(found.resources) == {"resource://docs", "resource://version"}  # config is metadata


def test_an_mcp_service_tool_without_a_schema_is_refused_with_what_to_do() -> None:
    with pytest.raises(RequestRefused, match="@schema_function"):
        mcp_tools.catalog({"tools": {"t": object()}}, {"type": "mcp", "service_schema": {"tools": {}}})


def test_the_protocol_revision_is_the_clients_if_spoken_here_else_the_newest() -> None:
    assert mcp_tools.protocol_version("2025-03-26") == "2025-03-26"
    assert mcp_tools.protocol_version("1999-01-01") == mcp_tools.PROTOCOL_VERSIONS[0]


def test_an_answer_becomes_text_blocks_json_for_what_is_not_a_string() -> None:
    assert mcp_tools.content("hi") == [{"type": "text", "text": "hi"}]
    assert mcp_tools.content({"a": 1}) == [{"type": "text", "text": '{"a": 1}'}]
    assert mcp_tools.content([1, "b"]) == [{"type": "text", "text": "1"}, {"type": "text", "text": "b"}]
