"""What a service looks like to an MCP client: its tools, resources and prompts (no I/O).

The names and shapes follow Hypha's MCP adapter: a function at ``a.b`` is the
tool ``a_b``, described by the schema hypha-rpc registered for it
(``service_schema``); a string field is a resource ``resource://{path}``; a
service of ``type: "mcp"`` may instead name its ``tools``, ``resources``
(``{uri, name, description, mime_type, read}``) and ``prompts``
(``{name, description, read}``) itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from switchboard.errors import RequestRefused

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""The revisions this server speaks, newest first (all carry the same methods it serves)."""

_METADATA = frozenset({"docs", "id", "name", "description", "type", "config"})  # not resources, as in Hypha
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "required": []}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    path: tuple[str, ...]  # where the function sits in the service

    def listed(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema}


@dataclass(frozen=True)
class ReadableEntry:
    """A resource or a prompt: read by calling the function at ``path`` (or a fixed text)."""

    name: str
    listed: dict[str, Any]
    path: tuple[str, ...] | None
    text: str | None = None


@dataclass(frozen=True)
class Catalog:
    tools: dict[str, Tool]
    resources: dict[str, ReadableEntry]  # by URI
    prompts: dict[str, ReadableEntry]  # by name


NATIVE = (
    "list_tools",
    "call_tool",
    "list_resources",
    "list_resource_templates",
    "read_resource",
    "list_prompts",
    "get_prompt",
)
"""Functions by which a service answers MCP's requests itself (Hypha's "native" MCP service)."""


def is_native(service: Any) -> bool:
    return isinstance(service, dict) and any(callable(service.get(name)) for name in NATIVE)


def protocol_version(requested: Any) -> str:
    """The revision to answer ``initialize`` with: the client's if spoken here, else the newest."""
    return requested if requested in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]


def _function_schema(entry: Any) -> dict[str, Any] | None:
    """``{"type": "function", "function": {...}}`` (as hypha-rpc registers it) or ``{name, parameters}``."""
    if not isinstance(entry, dict):
        return None
    if entry.get("type") == "function" and isinstance(entry.get("function"), dict):
        return dict(entry["function"])
    if "parameters" in entry or "description" in entry and "name" in entry:
        return dict(entry)
    return None


def _tool(name: str, schema: dict[str, Any], path: tuple[str, ...]) -> Tool:
    parameters = schema.get("parameters")
    return Tool(
        name=name,
        description=str(schema.get("description") or f"Function {name}"),
        input_schema=parameters if isinstance(parameters, dict) else dict(_NO_PARAMETERS),
        path=path,
    )


def _collect_tools(schema: Any, path: tuple[str, ...], out: dict[str, Tool]) -> None:
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if not isinstance(key, str) or key.startswith("_"):
            continue
        function = _function_schema(value)
        if function is not None:
            name = "_".join((*path, key))
            out[name] = _tool(name, function, (*path, key))
        else:
            _collect_tools(value, (*path, key), out)


def _collect_strings(value: Any, path: tuple[str, ...], out: dict[str, str]) -> None:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        key = str(key)
        if key.startswith("_") or (isinstance(value, dict) and key in _METADATA):
            continue
        if isinstance(item, str):
            out["/".join((*path, key))] = item
        elif isinstance(item, dict | list):
            _collect_strings(item, (*path, key), out)


def _string_resources(service: dict[str, Any], name: str) -> dict[str, ReadableEntry]:
    strings: dict[str, str] = {}
    _collect_strings(service, (), strings)
    if isinstance(service.get("docs"), str) and service["docs"]:
        strings["docs"] = service["docs"]
    found = {}
    for key, text in strings.items():
        uri = f"resource://{key}"
        title = (
            f"Documentation for {name}"
            if key == "docs"
            else " ".join(p.replace("_", " ").title() for p in key.split("/"))
        )
        listed = {
            "uri": uri,
            "name": title,
            "description": f"String resource at path '{key}'",
            "mimeType": "text/plain",
        }
        found[uri] = ReadableEntry(name=key, listed=listed, path=None, text=text)
    return found


def _inline(service: dict[str, Any], schema: dict[str, Any]) -> Catalog:
    """A ``type: "mcp"`` service naming its ``tools``, ``resources`` and ``prompts``."""
    tools: dict[str, Tool] = {}
    for key in service.get("tools") or {}:
        function = _function_schema((schema.get("tools") or {}).get(key))
        if function is None:
            raise RequestRefused(400, f"Tool '{key}' has no schema: declare it with hypha-rpc's @schema_function")
        tools[key] = _tool(key, function, ("tools", key))
    resources: dict[str, ReadableEntry] = {}
    for key, config in (service.get("resources") or {}).items():
        if not isinstance(config, dict) or "read" not in config:
            raise RequestRefused(400, f"Resource '{key}' must be a dictionary with a 'read' function")
        uri = str(config.get("uri", key))
        listed: dict[str, Any] = {
            "uri": uri,
            "name": str(config.get("name", key)),
            "description": str(config.get("description", "")),
            "mimeType": str(config.get("mime_type", "text/plain")),
        }
        resources[uri] = ReadableEntry(name=key, listed=listed, path=("resources", key, "read"))
    prompts: dict[str, ReadableEntry] = {}
    for key, config in (service.get("prompts") or {}).items():
        if not isinstance(config, dict) or "read" not in config:
            raise RequestRefused(400, f"Prompt '{key}' must be a dictionary with a 'read' function")
        read = _function_schema(((schema.get("prompts") or {}).get(key) or {}).get("read")) or {}
        parameters = read.get("parameters") or {}
        required = parameters.get("required") or []
        arguments = [
            {"name": arg, "description": str((spec or {}).get("description", "")), "required": arg in required}
            for arg, spec in (parameters.get("properties") or {}).items()
        ]
        name = str(config.get("name", key))
        listed = {
            "name": name,
            "description": str(config.get("description", "")),
            "arguments": arguments,
        }
        prompts[name] = ReadableEntry(name=key, listed=listed, path=("prompts", key, "read"))
    return Catalog(tools, resources, prompts)


def catalog(service: dict[str, Any], info: dict[str, Any]) -> Catalog:
    """The tools, resources and prompts the service ``info`` (its registered ``service``) offers."""
    schema = info.get("service_schema") or {}
    if info.get("type") == "mcp" and any(isinstance(service.get(k), dict) for k in ("tools", "resources", "prompts")):
        return _inline(service, schema)
    tools: dict[str, Tool] = {}
    _collect_tools(schema, (), tools)
    return Catalog(tools, _string_resources(service, str(info.get("name") or info.get("id"))), {})


def content(value: Any) -> list[dict[str, Any]]:
    """A function's answer as MCP content blocks: text, or each item's text for a list."""
    items = value if isinstance(value, list) else [value]
    blocks = []
    for item in items:
        if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
            blocks.append({"type": "text", "text": item["text"]})
        elif isinstance(item, str):
            blocks.append({"type": "text", "text": item})
        else:
            blocks.append({"type": "text", "text": json.dumps(item, default=str)})
    return blocks


def prompt_result(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        messages = [
            {"role": m.get("role", "user"), "content": content(m.get("content", ""))[0]}
            for m in value["messages"]
            if isinstance(m, dict)
        ]
        return {"description": str(value.get("description", f"Prompt for {name}")), "messages": messages}
    return {"description": f"Prompt for {name}", "messages": [{"role": "user", "content": content(str(value))[0]}]}


def resource_result(entry: ReadableEntry, value: Any) -> dict[str, Any]:
    mime = entry.listed.get("mimeType", "text/plain")
    return {
        "contents": [
            {"uri": entry.listed["uri"], "mimeType": mime, "text": value if isinstance(value, str) else str(value)}
        ]
    }
