"""The layers of docs/architecture.md, checked on the source: who may import whom.

Read statically (``ast``), type-checking imports included: a cycle that only
the type checker sees still ties two modules into one.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
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


# -- the sub-packages' order: a DAG, each layer importing only the layers below it ---------------------------------

# Lowest first. A unit is a sub-package (its modules and its ``__init__``), or one module of the top
# package ``switchboard`` itself (errors, clock, config...). A module may import its own unit and the
# units of lower layers: never a unit of a higher layer (up), nor another unit of its own layer
# (sideways). Every import counts: at module level, inside a function, and under ``if TYPE_CHECKING:``,
# since a name used only in a signature still ties the two packages into one for a reader and for the
# type checker.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("switchboard.errors",),
    ("switchboard.clock", "switchboard.tasks", "switchboard.metrics"),
    ("switchboard.protocol.hypha",),
    ("switchboard.protocol.link", "switchboard.config"),
    ("switchboard.protocol",),
    ("switchboard.client", "switchboard.backends"),
    ("switchboard.backends.redis.shared",),
    ("switchboard.backends.redis.bus", "switchboard.backends.redis.stores"),
    ("switchboard.backends.redis",),
    ("switchboard.hub.identity", "switchboard.replicas.dataplane", "switchboard.replicas.upkeep"),
    ("switchboard.replicas",),
    ("switchboard.hub.sessions",),
    ("switchboard.hub.routing",),
    ("switchboard.hub.transit", "switchboard.hub.gate"),
    ("switchboard.hub.manager",),
    ("switchboard.hub",),
    ("switchboard.server.process",),
    ("switchboard.server.common",),
    ("switchboard.server.ws", "switchboard.server.http"),
    ("switchboard.server",),
    ("switchboard.testing", "switchboard.cli"),
    ("switchboard", "switchboard.__main__"),
)

PACKAGES = frozenset(".".join(path.parent.relative_to(SRC.parent).parts) for path in SRC.rglob("__init__.py"))


def unit_of(module: str) -> str:
    """The sub-package ``module`` belongs to, or the module itself if it sits in ``switchboard``."""
    if module in PACKAGES:
        return module
    package = module.rpartition(".")[0]
    return module if package == "switchboard" else package


LAYER_OF = {unit: n for n, layer in enumerate(LAYERS) for unit in layer}


def imports_with_lines(tree: ast.Module) -> list[tuple[str, int]]:
    """Every ``switchboard`` module ``tree`` imports, with the line: at any depth, type checking included."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("switchboard"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.append((full if full in MODULES else node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names if a.name.startswith("switchboard"))
    return [(m, line) for m, line in out if m in MODULES]


def test_every_unit_has_its_place_in_the_layers() -> None:
    """Each sub-package and top module is declared once: a new package must be given its layer."""
    units = {unit_of(m) for m in MODULES}
    declared = [unit for layer in LAYERS for unit in layer]
    assert sorted(units - set(declared)) == [], "units missing from LAYERS"
    assert sorted(set(declared) - units) == [], "LAYERS names units that do not exist"
    assert len(declared) == len(set(declared)), "a unit is declared twice"


def test_no_import_goes_up_or_sideways_against_the_layers() -> None:
    """Each import reaches its own unit or a lower layer; the offending ones are named with their line."""
    against = []
    for module, tree in sorted(MODULES.items()):
        here = unit_of(module)
        for target, line in imports_with_lines(tree):
            there = unit_of(target)
            if there != here and LAYER_OF.get(there, -1) >= LAYER_OF.get(here, -1):
                way = "up" if LAYER_OF.get(there, -1) > LAYER_OF.get(here, -1) else "sideways"
                against.append(f"{module}:{line} imports {target} ({way}: {here} -> {there})")
    assert not against, "imports against the layers:\n" + "\n".join(against)


def test_no_class_name_is_defined_in_two_modules() -> None:
    """A class name says one thing in src/: two ``Released``, ``InFlight`` or ``Hold`` make a reader
    (and a wrong import) take one for the other. Private and nested classes count too."""
    where: dict[str, list[str]] = {}
    for module, tree in sorted(MODULES.items()):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(f"{module}:{node.lineno}")
    assert {name: places for name, places in where.items() if len(places) > 1} == {}


ARCHITECTURE = SRC.parents[1] / "docs" / "architecture.md"


def folders_in_the_docs() -> dict[str, set[str]]:
    """The "Folders" section of docs/architecture.md: each bullet's package, with what it says it holds."""
    text = ARCHITECTURE.read_text()
    section = text.split("\n## Folders\n", 1)[1].split("\n## ", 1)[0]
    found: dict[str, set[str]] = {}
    for line in section.splitlines():
        bullet = re.match(r"- `([\w/]+)/`: .*Holds (.+)\.$", line)
        if bullet:
            folder = bullet[1].removeprefix("switchboard").strip("/")
            found[folder] = {name.strip().replace("\\", "") for name in bullet[2].split(",")}
    return found


def folders_in_the_tree() -> dict[str, set[str]]:
    """Each package under src/switchboard/ (``""``: the top), with its sub-packages (``name/``) and modules."""
    found: dict[str, set[str]] = {}
    for init in SRC.rglob("__init__.py"):
        folder = init.parent
        subs = {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()}
        mods = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
        found[folder.relative_to(SRC).as_posix().removeprefix(".")] = subs | mods
    return found


def test_the_folders_section_names_every_package_and_no_other() -> None:
    """docs/architecture.md lists the tree as it is: one bullet per package, none for a package gone."""
    assert sorted(folders_in_the_docs()) == sorted(folders_in_the_tree())


def test_each_folder_holds_what_the_docs_say() -> None:
    """What each bullet says its package holds is there, and nothing there is left unsaid."""
    docs, tree = folders_in_the_docs(), folders_in_the_tree()
    wrong = {
        f: {"unsaid": sorted(tree[f] - docs[f]), "gone": sorted(docs[f] - tree[f])} for f in docs.keys() & tree.keys()
    }
    assert {f: w for f, w in wrong.items() if w["unsaid"] or w["gone"]} == {}


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
        "for m in pkgutil.walk_packages(p.__path__, 'switchboard.protocol.'): importlib.import_module(m.name)\n"
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
    "switchboard.hub.sessions.in_transit",
    "switchboard.hub.transit.retry_bound",
    "switchboard.hub.sessions.life",
    "switchboard.hub.identity.users",
    "switchboard.hub.identity.verified_tokens",
    "switchboard.replicas.upkeep.stale",
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
