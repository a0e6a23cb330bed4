"""The layers of docs/architecture.md, checked on the source: who may import whom.

Read statically (``ast``), type-checking imports included: a cycle that only
the type checker sees still ties two modules into one.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

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


# -- the pure cores: decisions as values, nothing with I/O loaded -----------------------------------------------

# Modules whose loading is I/O: the event loop, sockets, the servers and clients built on them, metrics.
IO = frozenset(
    {
        "asyncio",
        "selectors",
        "socket",
        "ssl",
        "subprocess",
        "http.client",
        "urllib.request",
        "redis",
        "valkey",
        "starlette",
        "uvicorn",
        "websockets",
        "httpx",
        "prometheus_client",
    }
)

# The cores that decide without I/O and are tested synchronously: the protocol, and the hub's and
# replicas' decision modules (the asyncio layers around them only carry their values out).
PURE = (
    *under("switchboard.protocol"),
    *under("switchboard.hub.routing."),  # hub/routing/: every module in it, today's and tomorrow's
    "switchboard.hub.transit.drain_pace",
    "switchboard.hub.transit.transit",
    "switchboard.hub.transit.retry_bound",
    "switchboard.hub.sessions.life",
    "switchboard.hub.identity.users",
    "switchboard.hub.identity.verified_tokens",
    "switchboard.replicas.stale",
    "switchboard.server.ws.frame_scan",
)

# Libraries a pure core may load although they load I/O, each with the module that imports it and
# what must move for the exception to go. None today: Permission and User live in hub/identity/users.py,
# apart from the tokens' PyJWT (hub/identity/auth.py), whose key client loads sockets.
KNOWN_IO_LIBRARIES: dict[str, set[str]] = {}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def loaded_imports(tree: ast.Module, *, lazy: bool) -> set[str]:
    """Every module ``tree`` imports when it runs, switchboard or not: no ``if TYPE_CHECKING:``
    import; the imports inside functions only if ``lazy`` (they load once the function runs)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            nodes: list[ast.AST] = list(node.orelse)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and not lazy:
            return
        else:
            nodes = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        for child in nodes:
            visit(child)

    visit(tree)
    return out


def loads(start: str) -> dict[str, set[str]]:
    """Each switchboard module that loading ``start`` loads, with what it imports itself. A pure core's
    imports inside functions count too; another module's only once they run, which a core never
    makes them do (``SystemClock.sleep``: a core takes a ``Clock`` and never sleeps)."""
    found: dict[str, set[str]] = {}
    todo = [start]
    while todo:
        module = todo.pop()
        if module in found:
            continue
        found[module] = loaded_imports(MODULES[module], lazy=module in PURE)
        todo.extend(m for m in found[module] if m in MODULES)
    return found


def every_import(tree: ast.Module) -> set[str]:
    """Every module ``tree`` names in an import, wherever the import stands."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def is_io(name: str) -> bool:
    return any(name == io or name.startswith(io + ".") for io in IO)


def test_the_protocol_layer_never_imports_asyncio() -> None:
    """Not even for a type, not even inside a function: the protocol is the sans-I/O part."""
    found = {
        module: sorted(m for m in every_import(MODULES[module]) if is_io(m)) for module in under("switchboard.protocol")
    }
    assert {m: io for m, io in found.items() if io} == {}


@pytest.mark.parametrize("core", PURE)
def test_a_pure_core_loads_nothing_with_io(core: str) -> None:
    """Whatever it imports, at any depth through switchboard's own modules, loads no I/O module."""
    found = {module: sorted(m for m in imports if is_io(m)) for module, imports in loads(core).items()}
    assert {m: io for m, io in found.items() if io} == {}, f"{core} loads I/O through these modules"


def test_the_libraries_the_pure_cores_use_load_nothing_with_io() -> None:
    """The third-party libraries the pure cores load, each imported in a fresh interpreter, load no
    I/O module themselves (``KNOWN_IO_LIBRARIES`` aside, each with what must move)."""
    libraries: dict[str, set[str]] = {}
    for core in PURE:
        for module, imports in loads(core).items():
            for name in imports:
                top = name.split(".")[0]
                if name not in MODULES and top != "switchboard" and top not in sys.stdlib_module_names:
                    libraries.setdefault(top, set()).add(module)
    assert libraries, "the walk found no library at all: it is broken"
    code = (
        "import importlib, json, sys\n"
        f"io = {sorted(IO)!r}\n"
        "out = {}\n"
        "for lib in sys.argv[1:]:\n"
        "    before = set(sys.modules)\n"
        "    importlib.import_module(lib)\n"
        "    out[lib] = sorted(m for m in set(sys.modules) - before if any(m == i or m.startswith(i + '.') for i in io))\n"
        "print(json.dumps(out))\n"
    )
    loaded = {}
    for lib in sorted(libraries):  # one interpreter each: a library loaded first hides nothing from the next
        ran = subprocess.run([sys.executable, "-c", code, lib], capture_output=True, text=True, timeout=60, check=True)
        loaded.update(json.loads(ran.stdout))
    with_io = {lib: sorted(libraries[lib]) for lib, io in loaded.items() if io}
    assert with_io == {lib: sorted(by) for lib, by in KNOWN_IO_LIBRARIES.items()}, (
        f"libraries that load I/O, by the modules importing them: {with_io}; I/O loaded: "
        f"{ {lib: io for lib, io in loaded.items() if io} }"
    )


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


def test_hub_routing_is_held_to_the_rule_of_the_pure_cores() -> None:
    """Every module under hub/routing/ is a pure core (``PURE``), the router first among them."""
    assert "switchboard.hub.routing.router" in PURE
    assert set(under("switchboard.hub.routing.")) <= set(PURE)


# -- one composition root ----------------------------------------------------------------------------------------


def _resolve(module: object, func: ast.expr) -> object:
    """What a call's callee names in ``module``'s globals (``None`` if it is not a global name or path)."""
    if isinstance(func, ast.Name):
        return getattr(module, func.id, None)
    if isinstance(func, ast.Attribute):
        owner = _resolve(module, func.value)
        return getattr(owner, func.attr, None) if owner is not None else None
    return None


def _switchboard_classes_called(module_name: str, function: ast.AST) -> list[str]:
    """The calls in ``function`` that construct a switchboard class (resolved in the module's globals)."""
    module = importlib.import_module(module_name)
    return sorted(
        ast.unparse(node.func)
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and inspect.isclass(cls := _resolve(module, node.func))
        and cls.__module__.startswith("switchboard")
    )


def _method(module_name: str, class_name: str, method: str) -> ast.FunctionDef:
    for node in ast.walk(MODULES[module_name]):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
    raise AssertionError(f"{module_name}.{class_name}.{method} not found")


def test_the_hub_constructs_none_of_its_collaborators() -> None:
    """``Hub.__init__`` keeps what the composition root (hub/assemble.py) hands it, and builds nothing."""
    init = _method("switchboard.hub.hub", "Hub", "__init__")
    assert _switchboard_classes_called("switchboard.hub.hub", init) == []
    # the check sees a construction where there is one: the composition root's
    assert "Hub" in _switchboard_classes_called("switchboard.hub.assemble", MODULES["switchboard.hub.assemble"])


def test_only_the_composition_root_builds_a_hub() -> None:
    builders = [
        name
        for name, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Hub"
    ]
    assert builders == ["switchboard.hub.assemble"]


# What the server may read of the hub besides its calls (admit, attach, detach, route, start, stop): settings,
# clock and counters, the clients here (the status page), the bus's health, the replica layer's presence, and
# the HTTP routes' port. Every other collaborator the hub is handed stays behind it.
SERVER_READS = frozenset({"settings", "clock", "metrics", "peers", "bus", "cluster", "http"})


def test_the_server_reaches_the_hubs_parts_only_through_its_http_port() -> None:
    """No ``hub.manager.directory`` or ``hub.gate.deletion`` under server/: the hub's collaborators (what
    ``Hub.__init__`` is handed) are off limits there, but for ``SERVER_READS``."""
    init = _method("switchboard.hub.hub", "Hub", "__init__")
    collaborators = {arg.arg for arg in init.args.kwonlyargs} - SERVER_READS
    assert {"manager", "gate", "registry"} <= collaborators
    reached = sorted(
        f"{module}: hub.{node.attr}"
        for module in under("switchboard.server")
        for node in ast.walk(MODULES[module])
        if isinstance(node, ast.Attribute)
        and node.attr in collaborators
        and (
            (isinstance(node.value, ast.Name) and node.value.id == "hub")
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "hub")
        )
    )
    assert reached == []
