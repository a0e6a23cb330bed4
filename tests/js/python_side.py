"""The Python counterpart of agent.mjs's service: what the JavaScript side calls."""

from __future__ import annotations

from typing import Any


def python_service() -> dict[str, Any]:
    """Service ``py``: echo, describe (types as Python saw them), values, apply (a callback), count (a generator)."""

    async def apply(callback: Any, value: Any) -> Any:
        return await callback(value)

    async def count(n: int) -> Any:
        for i in range(n):
            yield i

    def describe(value: Any) -> Any:
        """What arrived, by Python type (hypha-rpc decodes maps into dict-like proxies)."""
        if hasattr(value, "items"):
            return {k: describe(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [describe(v) for v in value]
        if isinstance(value, bytes):
            return f"bytes:{list(value)}"
        return f"{type(value).__name__}:{value!r}"

    return {
        "id": "py",
        "config": {"visibility": "public"},
        "echo": lambda value: value,
        "describe": describe,
        "values": lambda: dict(PY_VALUES),
        "apply": apply,
        "count": count,
    }


PY_VALUES: dict[str, Any] = {
    "int": 42,
    "negative": -7,
    "float": 3.5,
    "big": 2**40,
    "text": "héllo ✓",
    "empty": "",
    "yes": True,
    "no": False,
    "nothing": None,
    "list": [1, "two", None, [3]],
    "nested": {"a": [1, {"b": None, "c": "d"}], "e": {"f": {"g": 1.25}}},
    "bytes": b"\x00\x01\x02\xff",
}
