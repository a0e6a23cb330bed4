"""The layers of docs/architecture.md, checked on the source: who may import whom.

Read statically (``ast``), type-checking imports included: a cycle that only
the type checker sees still ties two modules into one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import switchboard

SRC = Path(switchboard.__file__).parent


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        found[name] = ast.parse(path.read_text())
    return found


MODULES = _modules()


def imports_of(tree: ast.Module) -> set[str]:
    """Every ``switchboard`` module ``tree`` imports, at any depth."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("switchboard"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("switchboard"))
    return out & MODULES.keys()


GRAPH = {name: imports_of(tree) for name, tree in MODULES.items()}


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def under(*prefixes: str) -> list[str]:
    return sorted(m for m in MODULES if m.startswith(prefixes))


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle anywhere in the package, type-checking imports included."""
    looped = [m for m in under("switchboard") if m in reachable(m)]
    assert looped == []


def test_backends_know_nothing_above_them() -> None:
    for module in under("switchboard.backends"):
        above = {
            m for m in GRAPH[module] if m.startswith(("switchboard.replicas", "switchboard.hub", "switchboard.server"))
        }
        assert not above, f"{module} imports {above}"


def test_the_replica_layer_does_not_import_the_hub_or_server() -> None:
    for module in under("switchboard.replicas"):
        above = {m for m in GRAPH[module] if m.startswith(("switchboard.hub", "switchboard.server"))}
        assert not above, f"{module} imports {above}"


def test_the_protocol_layer_loads_no_io_even_through_the_libraries_it_uses() -> None:
    """``protocol/`` is pure: no asyncio, no sockets, neither its own nor by way of msgpack or
    cryptography (its HKDF). Checked in a fresh interpreter, where nothing else loaded them first."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import switchboard.protocol as p\n"
        "for m in pkgutil.iter_modules(p.__path__): importlib.import_module('switchboard.protocol.' + m.name)\n"
        "print(*sorted({'asyncio', 'selectors', 'socket', 'ssl'} & sys.modules.keys()))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.split() == []


def test_redis_errors_are_translated_inside_the_redis_backend() -> None:
    """Above the backend a store failure is a BackendError: nothing else names RedisError."""
    outside = [
        m
        for m, tree in MODULES.items()
        if not m.startswith(("switchboard.backends.redis", "switchboard.testing")) and "RedisError" in names_in(tree)
    ]
    assert outside == []


def names_in(tree: ast.Module) -> set[str]:
    """Every name the code uses or imports (docstrings and comments aside)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names)
    return names
