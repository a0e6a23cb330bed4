"""``switchboard serve`` exit codes: what a supervisor (systemd, Kubernetes) acts on."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_a_port_already_taken_exits_3_and_says_why() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "switchboard", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 3  # never started: not the 0 of a clean, drained exit
    assert "address already in use" in done.stderr.lower()
