"""hypha-rpc's JavaScript client (npm 0.21.40, unmodified) with Python clients, in Node and in Chromium.

Every value type both ways (numbers, strings, nested objects, bytes as
``Uint8Array``, null), callbacks and generators both ways, client events and
server events; on one in-process hub, and across two replica processes
sharing a real Valkey (JavaScript on one, Python on the other).
"""

from __future__ import annotations

from typing import Any

import pytest
from python_side import PY_VALUES, python_service

from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.timeout(90)]

# PY_VALUES as JavaScript sees them (agent.mjs describe)
SEEN_BY_JS = {
    "int": "int:42",
    "negative": "int:-7",
    "float": "float:3.5",
    "big": "int:1099511627776",
    "text": "string:héllo ✓",
    "empty": "string:",
    "yes": "boolean:true",
    "no": "boolean:false",
    "nothing": "null",
    "list": ["int:1", "string:two", "null", ["int:3"]],
    "nested": {"a": ["int:1", {"b": "null", "c": "string:d"}], "e": {"f": {"g": "float:1.25"}}},
    "bytes": "Uint8Array[0,1,2,255]",
}
# agent.mjs jsValues() as Python sees them (conftest describe)
SEEN_BY_PYTHON = {
    "int": "int:42",
    "negative": "int:-7",
    "float": "float:3.5",
    "big": "int:1099511627776",
    "text": "str:'héllo ✓'",
    "empty": "str:''",
    "yes": "bool:True",
    "no": "bool:False",
    "nothing": "NoneType:None",
    "list": ["int:1", "str:'two'", "NoneType:None", ["int:3"]],
    "nested": {"a": ["int:1", {"b": "NoneType:None", "c": "str:'d'"}], "e": {"f": {"g": "float:1.25"}}},
    "bytes": "bytes:[0, 1, 2, 255]",
}


def plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


async def exercise(py: Any, agent: Any, py_url_client: Any) -> None:
    """Everything both ways between the Python client ``py`` and the agent; ``py_url_client`` makes another."""
    js = await py.get_service(agent.service_id)
    py_service = f"{py.config['workspace']}/{py.config['client_id']}:py"

    # Python -> JavaScript: values, a Python callback, a JavaScript generator
    assert plain(await js.echo(PY_VALUES)) == PY_VALUES
    assert plain(await js.describe(PY_VALUES)) == SEEN_BY_JS
    assert plain(await js.values()) == PY_VALUES, "jsValues() equals PY_VALUES, bytes included"
    assert await js.callBack(lambda x: x + 1, 41) == 42
    assert [i async for i in await js.count(5)] == [0, 1, 2, 3, 4]

    # JavaScript -> Python: the same, driven by the agent
    used = plain(await js.usePython(py_service))
    assert used == {
        "echoed": SEEN_BY_JS,
        "seenByPython": SEEN_BY_PYTHON,
        "valuesFromPython": SEEN_BY_JS,
        "callback": 42,
        "generated": [0, 1, 2, 3],
    }

    # events: a client event each way, and the server's events
    received: list[Any] = []
    await py.subscribe(["js-event"])
    py.on("js-event", lambda message: received.append(plain(message["data"])))
    kinds = ["py-event", "client_connected", "service_added", "service_removed", "client_disconnected"]
    assert await js.subscribe(kinds) is True
    await py.emit({"type": "py-event", "to": "*", "data": {"n": 1, "b": b"\x01"}})
    assert await js.emit("js-event", {"from": "js", "list": [1, None]}) is True
    await eventually(lambda: received == [{"from": "js", "list": [1, None]}], timeout=5, what="js-event in Python")

    token = await py.generate_token()
    other = await py_url_client(token=token, workspace=py.config["workspace"], client_id="visitor")
    await other.register_service({"id": "extra", "config": {"visibility": "public"}, "f": lambda: 1})
    await other.unregister_service("extra")
    await other.disconnect()

    async def all_seen() -> bool:
        events = plain(await js.events())
        found = [(e["type"], e["data"]) for e in events]
        return (
            ("py-event", {"n": 1, "b": b"\x01"}) in found
            and any(t == "client_connected" and d["id"].endswith("/visitor") for t, d in found)
            and any(t == "service_added" and d["id"].endswith("/visitor:extra") for t, d in found)
            and any(t == "service_removed" and d["id"].endswith("/visitor:extra") for t, d in found)
            and ("client_disconnected", {"id": "visitor", "workspace": py.config["workspace"]}) in found
        )

    await eventually(all_seen, timeout=10, what="the events in JavaScript")
    py_event = next(e for e in plain(await js.events()) if e["type"] == "py-event")
    assert py_event["from"] == f"{py.config['workspace']}/{py.config['client_id']}", "stamped by the hub"


async def test_everything_both_ways_on_one_replica(start_agent, server, connect):
    py = await connect(client_id="py")
    await py.register_service(python_service())
    token = await py.generate_token()
    agent = await start_agent(server_url=server.url, token=token, workspace=py.config["workspace"], client_id="js")
    try:
        await exercise(py, agent, lambda **kw: connect(**kw))
        if agent.page is not None:
            assert not agent.page.errors(), agent.log()
    except BaseException:
        print(f"--- {agent.runtime} agent log ---\n{agent.log()}")
        raise


@pytest.mark.cluster
async def test_everything_both_ways_across_two_replicas(start_agent, replicas, clients):
    a, b = replicas("ra"), replicas("rb")
    py = await clients(b.url, client_id="py")
    await py.register_service(python_service())
    token = await py.generate_token()
    agent = await start_agent(server_url=a.url, token=token, workspace=py.config["workspace"], client_id="js")
    try:
        await exercise(py, agent, lambda **kw: clients(b.url, **kw))
    except BaseException:
        print(f"--- {agent.runtime} agent log ---\n{agent.log()}\n--- ra ---\n{a.log_tail()}")
        raise
