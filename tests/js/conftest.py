"""Fixtures for the JavaScript tests: the unmodified hypha-rpc npm client in Node and in headless Chromium.

``scripts/js-deps`` (run by ``scripts/test``) installs node, npm and chromium
with apt if they are missing and ``tests/js/package.json`` into ``.cache/js``.
Without them these tests are skipped, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from switchboard.testing.browser import CHROMIUM, Chromium, Page, StaticServer
from switchboard.testing.wait import eventually

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODULES = ROOT / ".cache" / "js" / "node_modules"
CLIENT_DIST = MODULES / "hypha-rpc" / "dist"


def _missing() -> list[str]:
    missing = [tool for tool in ("node",) if shutil.which(tool) is None]
    if not Path(CHROMIUM).exists():
        missing.append("chromium")
    if not (CLIENT_DIST / "hypha-rpc-websocket.mjs").exists() or not (MODULES / "ws").exists():
        missing.append(".cache/js (npm packages)")
    return missing


@pytest.fixture(scope="session")
def js_tools() -> None:
    missing = _missing()
    if missing:
        message = f"JavaScript tests need {', '.join(missing)}: run scripts/js-deps"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def chromium(js_tools: None) -> Iterator[Chromium]:
    with Chromium() as browser:
        yield browser


@pytest.fixture(scope="session")
def static_server() -> Iterator[StaticServer]:
    """The agent page and the npm package's browser bundle, from an origin other than the hub's."""
    with StaticServer({"/": HERE, "/hypha-rpc/": CLIENT_DIST}) as server:
        yield server


@dataclass
class Agent:
    """A running agent.mjs: its service is ``<workspace>/<client_id>:js``."""

    runtime: str
    workspace: str
    client_id: str
    lines: list[str] = field(default_factory=list)
    page: Page | None = None

    @property
    def service_id(self) -> str:
        return f"{self.workspace}/{self.client_id}:js"

    def log(self) -> str:
        if self.page is not None:
            return "\n".join(f"[{e.level}] {e.text}" for e in self.page.console)
        return "\n".join(self.lines)

    async def wait_log(self, text: str, timeout: float = 10.0) -> None:
        await eventually(lambda: text in self.log(), timeout=timeout, what=f"{text!r} in the {self.runtime} log")


StartAgent = Callable[..., Awaitable[Agent]]


async def _start_node(stack: contextlib.AsyncExitStack, config: dict[str, Any], wait: bool) -> Agent:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(HERE / "node_agent.mjs"),
        json.dumps(config),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "SB_JS_MODULES": str(MODULES)},
    )

    async def stop() -> None:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        reader.cancel()

    lines: list[str] = []
    ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def read() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if line.startswith("READY ") and not ready.done():
                ready.set_result(json.loads(line[6:]))
            elif line.startswith("FAILED ") and not ready.done():
                ready.set_exception(AssertionError(f"node agent failed: {line[7:]}"))
        if not ready.done():
            ready.set_exception(AssertionError("node agent exited:\n" + "\n".join(lines)))

    reader = asyncio.create_task(read())
    stack.push_async_callback(stop)
    if not wait:
        return Agent("node", config.get("workspace") or "", config.get("client_id") or "", lines=lines)
    info = await asyncio.wait_for(ready, 30)
    return Agent("node", info["workspace"], info["clientId"], lines=lines)


async def _start_chromium(
    stack: contextlib.AsyncExitStack, browser: Chromium, static: StaticServer, config: dict[str, Any], wait: bool
) -> Agent:
    page = await stack.enter_async_context(browser.page())
    await page.goto(f"{static.url}/agent.html#{urllib.parse.quote(json.dumps(config))}")
    if not wait:
        return Agent("chromium", config.get("workspace") or "", config.get("client_id") or "", page=page)

    async def settled() -> dict[str, Any] | None:
        state = await page.evaluate("window.agent")
        return state if state and (state.get("ready") or state.get("error")) else None

    state = await eventually(settled, timeout=30, what="the agent page connecting")
    if state.get("error"):
        raise AssertionError(f"chromium agent failed: {state['error']}\n" + "\n".join(e.text for e in page.console))
    return Agent("chromium", state["workspace"], state["clientId"], page=page)


@pytest.fixture(params=["node", "chromium"])
async def start_agent(request: pytest.FixtureRequest, js_tools: None) -> AsyncIterator[StartAgent]:
    """``await start_agent(server_url=..., token=..., client_id=...)``: agent.mjs in Node or Chromium.

    Chromium loads it from :func:`static_server`, another origin than the hub's.
    """
    runtime = request.param
    browser = request.getfixturevalue("chromium") if runtime == "chromium" else None
    static = request.getfixturevalue("static_server") if runtime == "chromium" else None
    async with contextlib.AsyncExitStack() as stack:

        async def start(*, wait: bool = True, **config: Any) -> Agent:
            """Connected and serving (``wait=False``: just started, e.g. to watch a refusal)."""
            if browser is not None and static is not None:
                return await _start_chromium(stack, browser, static, config, wait)
            return await _start_node(stack, config, wait)

        yield start


@pytest.fixture
def redis_server() -> Iterator[Any]:
    from switchboard.testing import ValkeyServer

    with ValkeyServer() as valkey:
        yield valkey


@pytest.fixture
def replicas(redis_server: Any) -> Iterator[Callable[[str], Any]]:
    """``replicas("ra")``: a replica process sharing one real Valkey; all killed at the end."""
    from switchboard.testing.replica import ReplicaProcess

    started: list[ReplicaProcess] = []

    def start(replica_id: str) -> ReplicaProcess:
        replica = ReplicaProcess(replica_id=replica_id, redis_url=redis_server.url)
        started.append(replica)
        return replica.start()

    yield start
    for replica in started:
        replica.kill()
