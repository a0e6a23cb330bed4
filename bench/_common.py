"""Shared pieces of the comparison benchmark: statistics, child processes,
server processes, a failover TCP proxy standing in for a load balancer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import psutil

BENCH = Path(__file__).resolve().parent
WORKERS = str(BENCH / "_workers.py")
FLOOR = str(BENCH / "_floor.py")
CHILD_MAX_LIFETIME = 1200.0  # child processes exit on their own after this
JWT_SECRET = "bench-secret-0123456789abcdef0123456789"


# --------------------------------------------------------------------------- statistics


def pct(values: Iterable[float], p: float) -> float | None:
    """The ``p``-th percentile by nearest rank: the ceil(p/100 * n)-th smallest value; None if empty.

    The one percentile of bench/: every program ranks the same way (p50 of 1..10 is 5, p90 is 9).
    """
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def summarize_ms(samples: list[float]) -> dict[str, Any]:
    """Seconds in, milliseconds out."""
    s = sorted(samples)
    if not s:
        return {"n": 0}
    return {
        "n": len(s),
        "p50_ms": pct(s, 50) * 1e3,
        "p90_ms": pct(s, 90) * 1e3,
        "p99_ms": pct(s, 99) * 1e3,
        "mean_ms": statistics.fmean(s) * 1e3,
        "min_ms": s[0] * 1e3,
        "max_ms": s[-1] * 1e3,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or a != a or b != b:
        return None
    return a / b


def median_or_none(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and v == v]
    return statistics.median(vals) if vals else None


def err_key(exc: BaseException) -> str:
    """A short, aggregatable description: the exception type and the last line of its message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = re.sub(r"ws-user-[\w-]+", "<ws>", lines[-1] if lines else "")
    return f"{type(exc).__name__}: {text[:100]}" if text else type(exc).__name__


def calibrate() -> float:
    """A fixed CPU-bound workload, in ms (best of 3): how fast the machine is right now."""
    import msgpack

    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for i in range(20_000):
            msgpack.unpackb(msgpack.packb({"to": f"ws/c{i}", "type": "method", "args": [i, "x" * 32]}))
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def raise_fd_limit(wanted: int | None = None) -> dict[str, int]:
    """Soft RLIMIT_NOFILE up to ``wanted`` (default: the hard limit), never above the hard
    limit and never lowered; children inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = hard if hard != resource.RLIM_INFINITY else max(soft, 65536 if wanted is None else wanted)
    target = cap if wanted is None else min(max(wanted, soft), cap)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return {"soft_before": soft, "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "hard": hard}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_T0 = time.perf_counter()


def say(text: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- child processes


class Child:
    """A worker script (``_workers.py`` / ``_floor.py``) talking JSON lines over stdin/stdout."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, python: str = sys.executable) -> None:
        self.name = name
        self.argv = argv
        self.python = python
        self.log_path = log_dir / f"{name}.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> Child:
        err = await asyncio.to_thread(open, self.log_path, "ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.python,
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                limit=1 << 20,
            )
        finally:
            err.close()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def request(self, msg: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        assert self.proc is not None
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        if msg is not None:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
        return json.loads(line)

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)


async def stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def commands() -> AsyncIterator[dict[str, Any]]:
    """A child's commands, one JSON object per line on stdin, until stdin closes or the
    child has lived ``CHILD_MAX_LIFETIME`` (every wait for the next one is bounded by that too)."""
    stdin = await stdin_lines()
    deadline = time.monotonic() + CHILD_MAX_LIFETIME
    while time.monotonic() < deadline:
        try:
            line = await asyncio.wait_for(stdin.readline(), deadline - time.monotonic())
        except TimeoutError:
            return
        if not line:
            return
        yield json.loads(line)


def reply(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- server processes


class ServerProc:
    """One server process (a replica of either hub, or a floor relay) on a loopback port."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        port: int,
        *,
        env: dict[str, str] | None = None,
        ready_path: str = "/health/readiness",
        ws_path: str = "/ws",
    ) -> None:
        self.name = name
        self.cmd = cmd
        self.port = port
        self.env = {**os.environ, **(env or {})}
        self.ready_path = ready_path
        self.ws_path = ws_path
        self.dir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        self.log_path = self.dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{self.ws_path}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.dir, stdin=subprocess.DEVNULL
            )

    def wait_ready(self, timeout: float = 90.0) -> None:
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited during start:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + self.ready_path, timeout=1.0).status_code == 200:
                    self.start_seconds = time.perf_counter() - t0
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready within {timeout}s:\n{self.log_tail()}")

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate_timed(self, bound: float) -> dict[str, Any]:
        """SIGTERM; seconds until the process has exited (SIGKILL after ``bound``)."""
        if not self.is_running():
            return {"ok": False, "seconds": None, "detail": "not running"}
        assert self.proc is not None
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(bound)
        except subprocess.TimeoutExpired:
            dump = py_spy_dump(self.proc.pid)  # where it hangs, if py-spy is installed
            self.proc.kill()
            self.proc.wait(10)
            return {
                "ok": False,
                "seconds": None,
                "detail": f"still running {bound:g}s after SIGTERM: killed",
                "py_spy_dump": dump,
                "log_tail": self.log_tail(4000),
            }
        return {"ok": True, "seconds": time.perf_counter() - t0, "exit_code": code}

    def kill(self) -> None:
        if self.is_running():
            assert self.proc is not None
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)

    def rss(self) -> int | None:
        with contextlib.suppress(psutil.Error, TypeError):
            return int(psutil.Process(self.pid).memory_info().rss)
        return None

    def cpu_seconds(self) -> float | None:
        with contextlib.suppress(psutil.Error, TypeError):
            t = psutil.Process(self.pid).cpu_times()
            return t.user + t.system
        return None

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def log_errors(self, top: int = 6) -> dict[str, Any]:
        """Error lines of the whole log (ERROR/CRITICAL records, exceptions' last lines), counted
        after replacing ids and numbers, so that a thousand alike count as one kind."""
        kinds: Counter[str] = Counter()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return {"lines": 0, "top": []}
        for line in text.splitlines():
            if _ERROR_LINE.search(line):
                kinds[_normalize(line)] += 1
        return {"lines": sum(kinds.values()), "top": kinds.most_common(top)}


_ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|^[\w.]+(Error|Exception): ")


def _normalize(line: str) -> str:
    line = re.sub(r"^\S+ \S+,\d+ ", "", line)  # a timestamp
    line = re.sub(r"ws-user-[\w-]+|anonymouz-[\w-]+|[0-9a-f]{8,}|\d+", "#", line)
    return line.strip()[:160]


def py_spy_dump(pid: int) -> str | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return None
    with contextlib.suppress(Exception):
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=15)
        return (out.stdout + out.stderr)[-6000:]
    return None


def pid_rss(pid: int | None) -> int | None:
    with contextlib.suppress(psutil.Error, TypeError):
        return int(psutil.Process(pid).memory_info().rss)
    return None


def pid_cpu(pid: int | None) -> float | None:
    with contextlib.suppress(psutil.Error, TypeError):
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    return None


async def wait_quiet(pids: list[int | None], bound: float, threshold: float = 0.15) -> float:
    """Wait (at most ``bound`` s) until these processes together use < ``threshold`` CPU over 0.5 s."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < bound:
        c0 = sum(pid_cpu(p) or 0.0 for p in pids)
        await asyncio.sleep(0.5)
        c1 = sum(pid_cpu(p) or 0.0 for p in pids)
        if (c1 - c0) / 0.5 < threshold:
            break
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- load balancer


class FailoverProxy:
    """A loopback TCP proxy that sends each new connection to the first backend that
    accepts it: a load balancer in front of two replicas, as far as failover goes."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.port = 0
        self.server: asyncio.Server | None = None
        self.routed: list[int] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FailoverProxy:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_w: asyncio.StreamWriter | None = None
        try:
            for port in self.backends:
                try:
                    up_r, up_w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2.0)
                except (OSError, TimeoutError):
                    continue
                self.routed.append(port)
                break
            else:
                return
            await _splice(reader, writer, up_r, up_w)
        finally:
            for w in (writer, up_w):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()
            self._tasks.discard(task)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _splice(
    r1: asyncio.StreamReader, w1: asyncio.StreamWriter, r2: asyncio.StreamReader, w2: asyncio.StreamWriter
) -> None:
    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await r.read(1 << 16):
                w.write(data)
                await w.drain()

    tasks = [asyncio.create_task(pipe(r1, w2)), asyncio.create_task(pipe(r2, w1))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --------------------------------------------------------------------------- polling


async def poll_until_works(
    call: Callable[[], Awaitable[Any]], t0: float, bound: float, attempt_timeout: float = 0.5
) -> dict[str, Any]:
    """Retry ``call()`` until it succeeds; seconds since ``t0`` (perf_counter)."""
    errors: dict[str, int] = {}
    attempts = 0
    while attempts < int(bound / 0.02) + 1 and time.perf_counter() - t0 < bound:
        attempts += 1
        try:
            await asyncio.wait_for(call(), attempt_timeout)
        except Exception as exc:
            k = err_key(exc)
            errors[k] = errors.get(k, 0) + 1
            await asyncio.sleep(0.02)
            continue
        return {"ok": True, "seconds": time.perf_counter() - t0, "attempts": attempts, "errors": errors}
    return {"ok": False, "seconds": None, "attempts": attempts, "errors": errors}
