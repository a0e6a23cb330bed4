"""A Peer holds a client's identity and its queue, nothing its owners keep.

What the hub's parts keep about a connection (its services, its event
subscriptions, its frame rate, its select: allowance, whether it is counted,
its reconnection token) lives in the part that owns it, keyed by the
connection and freed when it is detached; no module outside
``hub/sessions/`` writes a ``Peer``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import switchboard
from switchboard.hub.sessions.peer import Peer
from switchboard.testing.hub import RunningServer
from switchboard.testing.wait import eventually

SRC = Path(switchboard.__file__).parent

# Kept by their owners, never on the Peer: the service directory, the subscribers' index, the
# gatekeeper, the reconnection tokens.
OWNED_ELSEWHERE = {
    "services",
    "service_bytes",
    "subscriptions",
    "rate",
    "allowance",
    "counted",
    "token",
    "token_signed_at",
}
# The one field a module outside hub/sessions/ writes: when the client's last frame came in.
WRITTEN_BY_THE_HUB = {("hub/hub.py", "last_heard")}


def _peer_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names in ``function`` that hold a Peer: its parameters annotated so, and by convention
    any name with ``peer`` in it and ``caller`` (an HTTP request's stand-in connection)."""
    named = {"caller"}
    args = function.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        if arg.annotation is not None and re.search(r"\bPeer\b", ast.unparse(arg.annotation)):
            named.add(arg.arg)
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and "peer" in node.id.lower():
            named.add(node.id)
    return named


def _writes_to_peer_fields(tree: ast.Module) -> list[tuple[int, str, str]]:
    """``(line, name, field)`` of every ``peer.field = ...`` (or ``peer.field[...] = ...``, ``+=``) in
    ``tree``: ``peer`` a name holding a Peer (:func:`_peer_names`), ``field`` a Peer field or one its
    owners keep."""
    fields = set(Peer.__slots__) | OWNED_ELSEWHERE
    found = set()
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        peers = _peer_names(function)
        for node in ast.walk(function):
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            while targets:
                target = targets.pop()
                if isinstance(target, (ast.Tuple, ast.List)):
                    targets.extend(target.elts)
                    continue
                if isinstance(target, ast.Subscript):
                    target = target.value
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in peers
                    and target.attr in fields
                ):
                    found.add((target.lineno, target.value.id, target.attr))
    return sorted(found)


def test_a_peer_has_no_field_that_another_part_owns() -> None:
    assert sorted(OWNED_ELSEWHERE & set(Peer.__slots__)) == [], "each kept by its owner, keyed by the connection"


def test_no_module_outside_the_sessions_package_writes_a_peer() -> None:
    writes = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("hub/sessions/"):
            continue
        for line, name, field in _writes_to_peer_fields(ast.parse(path.read_text())):
            if (rel, field) not in WRITTEN_BY_THE_HUB:
                writes.append(f"{rel}:{line}: {name}.{field}")
    assert writes == []


async def test_a_connection_that_leaves_is_freed_by_every_owner(server: RunningServer, connect: Any) -> None:
    """What each owner kept for a connection (its services, subscriptions, rate, count, select:
    allowance, reconnection token) is freed when the hub detaches it."""
    hub = server.hub
    owner = await connect(client_id="p0")
    other = await connect(client_id="p1", token=await owner.generate_token())
    for i, api in enumerate((owner, other)):
        await api.register_service({"id": "calc", "load": lambda i=i: i})
    assert await owner.subscribe(["my-event"]) is True
    await owner.get_service_info("calc", {"mode": "select:min:load"})  # its select: calls get an allowance
    peers = list(hub.peers.values())

    def kept() -> list[object]:
        return [
            (
                hub.manager.directory.keeps(peer),
                sorted(hub.subscribers.names_of(peer)),
                peer in hub.gate.rates,
                hub.gate.counts_in(peer),
            )
            for peer in peers
        ] + [len(hub.tokens)]

    assert kept() == [
        (True, ["client_disconnected", "my-event"], True, True),
        (True, ["client_disconnected"], True, True),
        2,
    ]
    for api in (owner, other):
        await api.disconnect()
    await eventually(lambda: not hub.peers, what="both detached")
    await eventually(lambda: kept() == [(False, [], False, False)] * 2 + [0], what="everything freed")
