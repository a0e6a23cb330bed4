"""Real replica processes for integration tests: start, SIGTERM, SIGKILL, restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from switchboard.testing.ports import free_port


class ReplicaProcess:
    """One ``switchboard serve`` in its own process, on a fixed loopback port.

    The port stays the same across :meth:`restart`, as a Kubernetes pod's
    address does behind its Service, so clients can reconnect to it.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        redis_url: str | None = None,
        jwt_secret: str = "test-secret-please-ignore-0123456789",
        state_dir: str | Path | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        public_url: str = "http://switchboard.test",
    ) -> None:
        self.replica_id = replica_id
        self.redis_url = redis_url
        self.jwt_secret = jwt_secret
        self.port = port or free_port()
        self.public_url = public_url
        self.extra_env = env or {}
        self.args = args or []
        self.proc: subprocess.Popen[bytes] | None = None
        scratch = Path(tempfile.mkdtemp(prefix=f"sb-{replica_id}-"))
        self._log = scratch / "replica.log"
        # its own state directory unless told to share one: never the real user's
        self.state_dir = Path(state_dir) if state_dir is not None else scratch / "state"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "switchboard",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--replica-id",
            self.replica_id,
        ]
        if self.jwt_secret:  # empty: the secret kept in the state directory
            cmd += ["--jwt-secret", self.jwt_secret]
        if self.redis_url:
            # replicas of one hub share the public URL (a load balancer's, in production)
            cmd += ["--redis-url", self.redis_url, "--public-url", self.public_url]
        return cmd + self.args

    def start(self, *, wait: bool = True, timeout: float = 20.0) -> ReplicaProcess:
        # the state directory as a variable, not a flag: a revision without the setting (bench/ab.py
        # runs older ones with this command) ignores it
        env = {**os.environ, "SWITCHBOARD_STATE_DIR": str(self.state_dir), **self.extra_env}
        with open(self._log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until readiness says 200. One HTTP client for all the looks: a new one each time (its TLS
        context) costs 20 ms of CPU, a third of a core taken from the replica it waits for."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=0.5) as http:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(
                        f"replica {self.replica_id} exited with {self.proc.returncode}:\n{self.log_tail()}"
                    )
                try:
                    if http.get(f"{self.url}/health/readiness").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"replica {self.replica_id} not ready within {timeout}s:\n{self.log_tail()}")

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait for the exit code (SIGKILL if it overstays ``timeout``)."""
        return self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> int:
        return self._signal_and_wait(signal.SIGKILL, 5.0)

    def _signal_and_wait(self, sig: int, timeout: float) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def restart(self) -> None:
        self.terminate()
        self.start()

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self._log.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def __repr__(self) -> str:
        return f"<ReplicaProcess {self.replica_id} port={self.port} running={self.is_running()}>"
