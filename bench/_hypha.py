"""The reference server: Hypha from PyPI, in its own venv (bench/.hypha-venv), run as
several replicas sharing one real Valkey.

How it is run, and why:

- ``python -m hypha.server --host 127.0.0.1 --port P --redis-uri redis://127.0.0.1:V/0
  --server-id hypha-a|hypha-b --public-base-url http://127.0.0.1:PA``: ``--redis-uri``
  makes the replicas share state and route to each other; ``--server-id`` must differ
  per replica (Switchboard's equivalent is ``--replica-id``; its ``--server-id`` names
  the hub and is the same on every replica).
- ``JWT_SECRET``: the same on both replicas, so tokens and reconnection tokens minted by
  one are accepted by the other (Switchboard: ``--jwt-secret``).
- ``HYPHA_MAX_CONNECTIONS_PER_USER`` / ``HYPHA_MAX_CLIENTS_PER_WORKSPACE`` (defaults 200 and
  1000) and the message-rate knobs raised: admission limits are policy, not cost, and
  Switchboard's own (connections per user/workspace, messages per second) are raised too.
  Everything else is Hypha's default (uvicorn's per-connection INFO log lines included).
- The venv is built with the packages PyPI had when hypha 0.21.137 was uploaded
  (``pip --uploaded-prior-to``), and ``sqlmodel==0.0.44``: sqlmodel 0.0.45 and later
  reject the naive datetimes Hypha 0.21.137 writes into its blocklist table, and the
  server then fails at startup ("Datetime values must have timezone information").
"""

from __future__ import annotations

import subprocess
import sys
import venv
from collections.abc import Callable

from _common import BENCH, JWT_SECRET, ServerProc

VENV = BENCH / ".hypha-venv"
PYTHON = VENV / "bin" / "python"
HYPHA_VERSION = "0.21.137"
HYPHA_RPC_VERSION = "0.21.47"
UPLOADED_PRIOR_TO = "2026-10-06T15:30:00Z"  # hypha 0.21.137 was uploaded 2026-10-06T15:28:29Z
REQUIREMENTS = [f"hypha[s3]=={HYPHA_VERSION}", f"hypha-rpc=={HYPHA_RPC_VERSION}", "sqlmodel==0.0.44"]
MARKER = VENV / ".bench-requirements"
ENV = {
    "JWT_SECRET": JWT_SECRET,
    "HYPHA_MAX_CONNECTIONS_PER_USER": "100000",
    "HYPHA_MAX_CLIENTS_PER_WORKSPACE": "100000",
    "HYPHA_WS_MSG_RATE_LIMIT": "1000000",  # read but not enforced by 0.21.137; set for symmetry
    "HYPHA_WS_MSG_BURST_LIMIT": "1000000",
}


def spec() -> str:
    return " ".join([*REQUIREMENTS, f"--uploaded-prior-to={UPLOADED_PRIOR_TO}"])


def ensure_venv(log: Callable[[str], None] = print) -> dict[str, str]:
    """Create bench/.hypha-venv and install Hypha into it, unless already done."""
    if PYTHON.exists() and MARKER.exists() and MARKER.read_text().strip() == spec():
        return {"venv": str(VENV), "installed": "already", "spec": spec()}
    log(f"building {VENV} ({spec()}); this takes a minute")
    if not PYTHON.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    install_log = VENV / "install.log"
    with open(install_log, "ab") as out:
        for cmd in (
            [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "-U", "pip"],
            [
                str(PYTHON),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                f"--uploaded-prior-to={UPLOADED_PRIOR_TO}",
                *REQUIREMENTS,
            ],
        ):
            out.write(f"$ {' '.join(cmd)}\n".encode())
            out.flush()
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode:
                tail = install_log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"installing Hypha failed: {' '.join(cmd)}\n{tail}")
    check = subprocess.run(
        [str(PYTHON), "-c", "import hypha, hypha_rpc; print(hypha.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check.returncode or check.stdout.strip() != HYPHA_VERSION:
        raise RuntimeError(f"Hypha venv is not usable: {check.stdout}{check.stderr[-2000:]}")
    MARKER.write_text(spec() + "\n")
    return {"venv": str(VENV), "installed": "now", "spec": spec()}


def versions() -> dict[str, str]:
    out = subprocess.run(
        [
            str(PYTHON),
            "-c",
            "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('hypha', 'hypha-rpc', 'uvicorn', 'websockets', 'redis', 'fastapi', 'sqlmodel')}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return {"versions_json": out.stdout.strip()}


def replica(name: str, port: int, redis_url: str, public_port: int) -> ServerProc:
    cmd = [
        str(PYTHON),
        "-m",
        "hypha.server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--redis-uri",
        redis_url,
        "--server-id",
        name,
        "--public-base-url",
        f"http://127.0.0.1:{public_port}",
    ]
    return ServerProc(name, cmd, port, env=ENV)


if __name__ == "__main__":
    print(ensure_venv())
    sys.exit(0)
