"""Balanced handles with the unmodified hypha-rpc JavaScript client (0.21.40) in Node (issue 41).

A Node caller's ``getService("calc", {mode: "balance:round_robin"})`` spreads its
calls over instances Python clients registered, and ``balance:least_busy``
works; an instance Node registered (declaring ``get`` idempotent in its
config) takes balanced calls from a Python caller, and a call in flight to it
goes to another instance when it disconnects. One hub for the module.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hypha_rpc import connect_to_server

from switchboard.testing.hub import RunningServer, running, settings_for_tests

HERE = Path(__file__).resolve().parent
MODULES = HERE.parents[1] / ".cache" / "js" / "node_modules"

pytestmark = [pytest.mark.timeout(90), pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hub() -> AsyncIterator[RunningServer]:
    async with running(settings_for_tests()) as srv:
        yield srv


async def _python_instances(url: str, n: int) -> tuple[list[Any], str]:
    owner = await connect_to_server({"server_url": url, "client_id": "py0"})
    token = await owner.generate_token()
    apis = [owner] + [
        await connect_to_server({"server_url": url, "client_id": f"py{i}", "token": token}) for i in range(1, n)
    ]
    for i, api in enumerate(apis):
        await api.register_service(
            {"id": "calc", "config": {"idempotent": ["get"]}, "who": (lambda i=i: f"py{i}"), "get": lambda: "py"}
        )
    return apis, token


async def _node(job: dict[str, Any]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        "node",
        str(HERE / "node_balanced.mjs"),
        json.dumps(job),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "SB_JS_MODULES": str(MODULES)},
    )


async def _line(proc: asyncio.subprocess.Process, prefix: str, timeout: float = 30.0) -> str:
    """The next line of the Node process that starts with ``prefix`` (its rest); fails on ``FAILED``."""
    assert proc.stdout is not None
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        for _ in range(1000):
            raw = await proc.stdout.readline()
            if not raw:
                break
            line = raw.decode(errors="replace").rstrip()
            seen.append(line)
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
            if line.startswith("FAILED"):
                break
    raise AssertionError(f"no {prefix!r} line from node:\n" + "\n".join(seen))


async def _ended(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


async def test_a_node_caller_spreads_its_calls_over_python_instances(hub, js_tools):
    apis, token = await _python_instances(hub.url, 3)
    ws = apis[0].config.workspace
    node = await _node(
        {
            "role": "caller",
            "connect": {"server_url": hub.url, "client_id": "js-caller", "token": token, "workspace": ws},
            "modes": ["balance:round_robin", "balance:least_busy"],
            "calls": 30,
        }
    )
    try:
        answers = json.loads(await _line(node, "RESULT"))
    finally:
        await _ended(node)
        for api in apis:
            await api.disconnect()
    assert collections.Counter(answers["balance:round_robin"]) == {"py0": 10, "py1": 10, "py2": 10}
    # one call at a time: each instance is as idle as the others, so least_busy takes them in turn
    assert set(answers["balance:least_busy"]) == {"py0", "py1", "py2"}


async def test_a_node_instance_takes_balanced_calls_and_one_in_flight_fails_over_when_it_leaves(hub, js_tools):
    apis, token = await _python_instances(hub.url, 1)
    ws = apis[0].config.workspace
    node = await _node(
        {"role": "instance", "connect": {"server_url": hub.url, "client_id": "js0", "token": token, "workspace": ws}}
    )
    caller = await connect_to_server({"server_url": hub.url, "client_id": "py-caller", "token": token})
    try:
        await _line(node, "READY")
        calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
        assert {await calc.who() for _ in range(4)} == {"py0", "js"}
        calls = [asyncio.ensure_future(calc.get()) for _ in range(2)]  # one runs on the Node instance
        await _line(node, "STARTED")
        assert node.stdin is not None
        node.stdin.write(b"leave\n")
        await node.stdin.drain()
        await _line(node, "LEFT")
        assert await asyncio.wait_for(asyncio.gather(*calls), 10) == ["py", "py"]
    finally:
        await _ended(node)
        await caller.disconnect()
        for api in apis:
            await api.disconnect()
