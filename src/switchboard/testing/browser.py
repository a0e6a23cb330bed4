"""Headless Chromium driven over the DevTools protocol (CDP), and a static file server for its pages.

No browser download and no driver: Debian's ``/usr/bin/chromium``, started with
``--remote-debugging-port=0``, and this module speaking CDP to it over a
WebSocket (``websockets``). A :class:`Page` records what a person would see in
the console (``console.*`` calls, uncaught exceptions, failed loads), evaluates
JavaScript and takes screenshots::

    with Chromium() as browser:
        async with browser.page() as page:
            await page.goto("http://127.0.0.1:8000/")
            title = await page.evaluate("document.title")
            png = await page.screenshot()
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import http.server
import itertools
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets

CHROMIUM = "/usr/bin/chromium"
# What Chromium needs to run headless as root in a container, and what keeps it
# from reaching out on its own (updates, sync, field trials, QUIC probes).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--mute-audio",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--password-store=basic",
)


class BrowserError(RuntimeError):
    """Chromium did not start, or a CDP command failed."""


class Chromium:
    """One headless Chromium process with a fresh profile; pages come from :meth:`page`."""

    def __init__(
        self, binary: str = CHROMIUM, *, window: tuple[int, int] = (1280, 800), extra_args: tuple[str, ...] = ()
    ) -> None:
        self.binary = binary
        self.window = window
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self._profile: str | None = None
        self.ws_url = ""

    def start(self, timeout: float = 15.0) -> Chromium:
        self._profile = tempfile.mkdtemp(prefix="sb-chromium-")
        width, height = self.window
        cmd = [
            self.binary,
            *FLAGS,
            *self.extra_args,
            f"--user-data-dir={self._profile}",
            "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        active = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self.proc.returncode}")
            lines = active.read_text().split() if active.exists() else []
            if len(lines) >= 2:
                self.ws_url = f"ws://127.0.0.1:{lines[0]}{lines[1]}"
                return self
            time.sleep(0.05)
        self.stop()
        raise BrowserError(f"chromium did not open its debugging port within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._profile:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    def __enter__(self) -> Chromium:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextlib.asynccontextmanager
    async def page(self) -> AsyncIterator[Page]:
        """A tab in a browser context of its own (no cookies or storage shared with other pages)."""
        async with self.tabs(1) as (page,):
            yield page

    @contextlib.asynccontextmanager
    async def tabs(self, count: int) -> AsyncIterator[tuple[Page, ...]]:
        """``count`` tabs of one visitor: one browser context, so they share its cookies (and no other's)."""
        async with CDPConnection.open(self.ws_url) as cdp:
            context = (await cdp.send("Target.createBrowserContext"))["browserContextId"]
            try:
                pages = []
                for _ in range(count):
                    created = await cdp.send("Target.createTarget", {"url": "about:blank", "browserContextId": context})
                    attach = {"targetId": created["targetId"], "flatten": True}
                    page = Page(cdp, (await cdp.send("Target.attachToTarget", attach))["sessionId"])
                    await page.enable()
                    pages.append(page)
                yield tuple(pages)
            finally:
                with contextlib.suppress(Exception):
                    await cdp.send("Target.disposeBrowserContext", {"browserContextId": context})


class CDPConnection:
    """Commands and events over the browser's DevTools WebSocket (flattened sessions)."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._listeners: list[Callable[[str, dict[str, Any], str | None], None]] = []
        self._reader = asyncio.create_task(self._read(), name="cdp reader")

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, url: str) -> AsyncIterator[CDPConnection]:
        async with websockets.connect(url, max_size=64 << 20, ping_interval=None) as ws:
            cdp = cls(ws)
            try:
                yield cdp
            finally:
                cdp._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await cdp._reader

    def listen(self, callback: Callable[[str, dict[str, Any], str | None], None]) -> None:
        self._listeners.append(callback)

    async def send(
        self, method: str, params: Mapping[str, Any] | None = None, *, session: str | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": dict(params or {})}
        if session:
            message["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self._ws.send(json.dumps(message))
        try:
            reply = await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(ident, None)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def _read(self) -> None:
        try:
            async for raw in self._ws:
                message = json.loads(raw)
                if "id" in message:
                    future = self._pending.get(message["id"])
                    if future is not None and not future.done():
                        future.set_result(message)
                    continue
                for listener in self._listeners:
                    listener(message.get("method", ""), message.get("params", {}), message.get("sessionId"))
        except websockets.ConnectionClosed:
            pass
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(BrowserError("the browser closed the DevTools connection"))


@dataclass
class ConsoleEntry:
    level: str  # log, info, warning, error, exception, ...
    text: str
    url: str = ""


@dataclass
class Page:
    """One tab: navigate, evaluate, screenshot; everything its console said is in :attr:`console`."""

    cdp: CDPConnection
    session: str
    console: list[ConsoleEntry] = field(default_factory=list)

    async def enable(self) -> None:
        self.cdp.listen(self._on_event)
        for domain in ("Runtime", "Log", "Page"):
            await self.send(f"{domain}.enable")

    async def send(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return await self.cdp.send(method, params, session=self.session, **kw)

    def _on_event(self, method: str, params: dict[str, Any], session: str | None) -> None:
        if session != self.session:
            return
        if method == "Runtime.consoleAPICalled":
            text = " ".join(_remote_text(a) for a in params.get("args", []))
            self.console.append(ConsoleEntry(params.get("type", "log"), text))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text", "")
            self.console.append(ConsoleEntry("exception", text, details.get("url", "")))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            self.console.append(ConsoleEntry(entry.get("level", "info"), entry.get("text", ""), entry.get("url", "")))

    def errors(self) -> list[ConsoleEntry]:
        """What a person would see in red: console errors, uncaught exceptions, failed loads."""
        return [e for e in self.console if e.level in ("error", "exception")]

    async def goto(self, url: str, *, timeout: float = 15.0) -> None:
        loaded = asyncio.get_running_loop().create_future()

        def on_load(method: str, params: dict[str, Any], session: str | None) -> None:
            if session == self.session and method == "Page.loadEventFired" and not loaded.done():
                loaded.set_result(None)

        self.cdp.listen(on_load)
        reply = await self.send("Page.navigate", {"url": url})
        if reply.get("errorText"):
            raise BrowserError(f"navigating to {url}: {reply['errorText']}")
        await asyncio.wait_for(loaded, timeout)

    async def evaluate(self, expression: str, *, timeout: float = 30.0) -> Any:
        """The value of ``expression`` (a promise is awaited), as JSON."""
        reply = await self.send(
            "Runtime.evaluate",
            {
                "expression": expression,
                "awaitPromise": True,
                "returnByValue": True,
            },
            timeout=timeout,
        )
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description") or details.get("text"))
        return reply.get("result", {}).get("value")

    async def screenshot(self, *, width: int | None = None, height: int | None = None) -> bytes:
        if width and height:
            await self.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
        data = (await self.send("Page.captureScreenshot", {"format": "png"}))["data"]
        return base64.b64decode(data)


def _remote_text(arg: dict[str, Any]) -> str:
    if "value" in arg:
        value = arg["value"]
        return value if isinstance(value, str) else json.dumps(value)
    return str(arg.get("description") or arg.get("unserializableValue") or arg.get("type", ""))


class StaticServer:
    """Files over HTTP on a free loopback port, in a thread: ``{"/": dir, "/lib/": other_dir}``.

    Its origin differs from the hub's (another port), as a web page's usually does.
    """

    TYPES = {
        ".mjs": "text/javascript",
        ".js": "text/javascript",
        ".map": "application/json",
        ".html": "text/html",
        ".css": "text/css",
        ".json": "application/json",
    }

    def __init__(self, mounts: Mapping[str, str | Path]) -> None:
        # longest prefix first, so "/lib/" wins over "/"
        self.mounts = sorted(((p, Path(d)) for p, d in mounts.items()), key=lambda m: -len(m[0]))
        handler = functools.partial(_MountHandler, server=self)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="static server", daemon=True)

    def __enter__(self) -> StaticServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def resolve(self, path: str) -> Path | None:
        path = path.split("?", 1)[0]
        for prefix, root in self.mounts:
            if path.startswith(prefix):
                candidate = (root / path[len(prefix) :]).resolve()
                if candidate.is_file() and candidate.is_relative_to(root.resolve()):
                    return candidate
                return None
        return None


class _MountHandler(http.server.BaseHTTPRequestHandler):
    def __init__(self, *args: Any, server: StaticServer, **kw: Any) -> None:
        self.static = server
        super().__init__(*args, **kw)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        found = self.static.resolve(self.path)
        if found is None:
            self.send_error(404)
            return
        body = found.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", StaticServer.TYPES.get(found.suffix, "application/octet-stream"))
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass
