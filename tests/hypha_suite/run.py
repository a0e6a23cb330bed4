"""Run Hypha's own hub-level tests against Switchboard, once; not part of the suite.

``scripts/hypha-suite`` runs it. Hypha's tests come from its source
distribution (``pip download --no-binary :all: --no-deps hypha==0.21.137``
carries ``tests/``), unchanged but for their conftest.py, which is replaced
by ``conftest_switchboard.py`` (the fixtures, satisfied by Switchboard). They
run in a client venv of their own (hypha-rpc and what the tests import, not
Hypha's server) with ``shim/`` first on the path: the token helpers they
import from ``hypha.core.auth`` mint the same claims with Switchboard's
issuer. The hubs are started here, at the addresses Hypha's tests name
(tests/__init__.py): one embedded hub for ``fastapi_server``, another for
``fastapi_server_sqlite``, and a Valkey with two replicas for the
two-server files. Each file runs in its own pytest process, every test
bounded by ``--timeout`` and every file by a multiple of it; the results
are printed per file and kept in ``.cache/hypha-suite/results``.

Arguments: test file names (default: :data:`FILES`); ``--timeout SECONDS``
per test (default 180: a few of Hypha's tests block their own loop on
synchronous HTTP requests to a service that loop provides, and wait out the 30 s call timeout).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from switchboard.clock import SystemClock
from switchboard.config import Settings
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import ROOT, Permission
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.valkey import ValkeyServer

ROOT_DIR = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = ROOT_DIR / ".cache" / "hypha-suite"
HYPHA = "hypha==0.21.137"
# the client venv: hypha-rpc as the project pins it, what Hypha's tests import, the test tools;
# the versions the project pins where it pins them
CLIENT_REQUIREMENTS = (
    "hypha-rpc==0.21.47",
    "pytest==9.2.0",
    "pytest-asyncio==1.5.0",
    "pytest-timeout==2.4.0",
    "httpx==0.28.1",
    "requests==2.34.2",
    "msgpack==1.2.4",
    "numpy==2.4.6",
    "redis==8.1.0",
    "PyJWT==2.15.1",
    "shortuuid==1.0.13",
    "pydantic==2.14.4",
    "fastapi==0.115.2",  # the highest Hypha 0.21.137 allows
)
# The hub-level files: connect, services, RPC and events, workspaces, tokens, HTTP service routes
# and the HTTP transport, ASGI routes, two servers on one Redis, the admin and queue services.
# Left out: server apps, workers, artifacts, S3, git, vectors, MCP/A2A, browsers, login pages,
# and files that start Hypha's own server processes or test its modules directly.
FILES = (
    "test_server.py",
    "test_services.py",
    "test_messages.py",
    "test_peer_not_found.py",
    "test_reconnection_register_service.py",
    "test_workspace.py",
    "test_workspace_security.py",
    "test_token.py",
    "test_owner_generate_token.py",
    "test_http.py",
    "test_http_cross_workspace.py",
    "test_http_rpc.py",
    "test_http_rpc_transport.py",
    "test_http_rpc_manager_service.py",
    "test_asgi.py",
    "test_asgi_missing_service.py",
    "test_asgi_unknown_workspace.py",
    "test_admin.py",
    "test_queue.py",
    "test_multi_replica_integration.py",
)
# Tests of those files left out, each for what it needs that is outside a hub (the issue's list:
# server apps, workers, the artifact manager, S3, browsers; and Hypha's login service, its own
# Python modules, its command-line plugin runner, its Redis keys). Printed with the results.
SERVER_APPS = "installs a server app (public/server-apps)"
LEFT_OUT = {
    "test_server.py::test_plugin_runner": "runs Hypha's plugin runner (python -m hypha.runner)",
    "test_server.py::test_plugin_runner_subpath": "runs Hypha's plugin runner (python -m hypha.runner)",
    "test_server.py::test_plugin_runner_workspace": "runs Hypha's plugin runner (python -m hypha.runner)",
    "test_workspace.py::test_workspace": "expects Hypha's public service s3-storage",
    "test_workspace.py::test_service_selection_mode": "the artifact manager (public/artifact-manager)",
    "test_workspace.py::test_parse_token_workspace_validation": "Hypha's own module (hypha.core.auth._parse_token)",
    "test_workspace_security.py::test_public_artifact_manager_context": "the artifact manager",
    "test_workspace_security.py::test_artifact_manager_workspace_isolation": "the artifact manager",
    "test_workspace_security.py::test_permission_escalation_prevention": "the artifact manager (its second half)",
    "test_http.py::test_http_proxy": SERVER_APPS,
    "test_asgi.py::test_asgi_serverapp": SERVER_APPS,
    "test_asgi.py::test_functions": SERVER_APPS,
    "test_asgi.py::test_nested_functions": SERVER_APPS,
    "test_asgi.py::test_default_fallback_function": SERVER_APPS,
    "test_asgi.py::test_nested_functions_with_default": SERVER_APPS,
    "test_asgi.py::test_find_nested_function": "Hypha's own module (hypha.http.ASGIRoutingMiddleware)",
    "test_admin.py::test_admin_terminal_basic": "Hypha's own module (hypha.admin.AdminTerminal)",
    "test_admin.py::test_admin_utilities_setup": "Hypha's own module (hypha.admin.setup_admin_services)",
    "test_multi_replica_integration.py::test_leader_election_exactly_one_leader": (
        "reads Hypha's own Redis keys (hypha:leader)"
    ),
    "test_multi_replica_integration.py::test_reset_guard_preserved_first_server_state": (
        "reads Hypha's own Redis keys (services:*)"
    ),
}
# where Hypha's tests expect them (its tests/__init__.py)
PORT = 38283
PORT_SQLITE = PORT + 20
PORT_REDIS_1 = PORT + 8
REDIS_PORT = 6338
SECRET_BYTES = 32
FILE_GRACE = 120.0  # seconds a file's process may take beyond its tests' bounds (start-up, collection)
PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
addopts = -p no:cacheprovider -q -rN
"""


@dataclass
class FileResult:
    name: str
    seconds: float = 0.0
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # test -> the error it stopped at
    skipped: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)  # test -> what it needs that a hub is not
    note: str = ""


def pip(python: Path, *args: str) -> None:
    """Run pip, its chatter kept in ``pip.log`` and shown only if it fails."""
    log = CACHE / "pip.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        done = subprocess.run(
            [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], stdout=out, stderr=out
        )
    if done.returncode:
        sys.exit(f"pip {' '.join(args)} failed:\n{log.read_text(errors='replace')[-3000:]}")


def hypha_tests() -> Path:
    """Hypha's tests/ from its sdist, unpacked afresh, with our conftest.py and a pytest.ini."""
    sdist_dir = CACHE / "sdist"
    sdists = sorted(sdist_dir.glob("hypha-*.tar.gz"))
    if not sdists:
        sdist_dir.mkdir(parents=True, exist_ok=True)
        pip(Path(sys.executable), "download", "--no-binary", ":all:", "--no-deps", HYPHA, "-d", str(sdist_dir))
        sdists = sorted(sdist_dir.glob("hypha-*.tar.gz"))
    work = CACHE / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with tarfile.open(sdists[-1]) as tar:
        top = tar.getnames()[0].split("/")[0]
        members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/tests/")]
        tar.extractall(work, members=members, filter="data")
    tests = work / "tests"
    (work / top / "tests").rename(tests)
    (work / top).rmdir()
    shutil.copy(HERE / "conftest_switchboard.py", tests / "conftest.py")
    # test_server.py::test_extra_mounts fetches this file through the /tests mount; Hypha's
    # repository has it, its sdist does not: a stand-in with the text the test looks for
    (tests / "testWindowPlugin1.imjoy.html").write_text(
        "<!-- stand-in written by scripts/hypha-suite: the sdist lacks this file -->\n"
        '<config lang=\'json\'>{"name": "Test Window Plugin"}</config>\n'
    )
    (work / "pytest.ini").write_text(PYTEST_INI)
    return tests


def client_venv() -> Path:
    """The venv the tests run in, made once per requirement list."""
    venv = CACHE / "venv"
    python = venv / "bin" / "python"
    stamp = venv / (".installed-" + hashlib.sha256("\n".join(CLIENT_REQUIREMENTS).encode()).hexdigest()[:16])
    if not stamp.exists():
        print(f"making the client venv {venv}", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip(python, "install", *CLIENT_REQUIREMENTS)
        stamp.touch()
    return python


@dataclass
class Hubs:
    secret: str
    redis_url: str
    redis_2_url: str
    processes: list[ReplicaProcess]

    def check(self) -> str:
        """Restart any hub that died (a test file may kill it); say which."""
        died = [p for p in self.processes if not p.is_running()]
        for p in died:
            p.start()
        return ", ".join(f"{p.replica_id} had exited and was restarted" for p in died)


def hub_args(tests: Path) -> list[str]:
    """Options of the main hub for what Hypha's ``fastapi_server`` is started with, where
    Switchboard has the setting: ``--static-mounts=/tests:./tests``."""
    names = {f.name for f in dataclasses.fields(Settings)}
    return ["--static-mounts", f"/tests:{tests}"] if "static_mounts" in names else []


def check_ports_free() -> None:
    """Fail at once, saying which, if a port Hypha's tests name is taken (a hub left running?)."""
    for port in (PORT, PORT_SQLITE, PORT_REDIS_1, REDIS_PORT):
        with socket.socket() as probe:
            # as the hubs bind: a port whose last connections linger in TIME_WAIT is free
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                sys.exit(f"port {port} on 127.0.0.1 is in use; Hypha's tests expect a hub or Valkey there")


@contextmanager
def hubs(tests: Path) -> Iterator[Hubs]:
    check_ports_free()
    secret = secrets.token_urlsafe(SECRET_BYTES)
    with ExitStack() as stack:
        valkey = stack.enter_context(ValkeyServer(port=REDIS_PORT))
        redis_url = f"redis://127.0.0.1:{valkey.port}/0"
        processes = [
            ReplicaProcess(replica_id="hub", port=PORT, jwt_secret=secret, args=hub_args(tests)),
            ReplicaProcess(replica_id="hub-sqlite", port=PORT_SQLITE, jwt_secret=secret),
            ReplicaProcess(replica_id="server-0", port=PORT_REDIS_1, jwt_secret=secret, redis_url=redis_url),
            ReplicaProcess(replica_id="server-1", jwt_secret=secret, redis_url=redis_url),
        ]
        for p in processes:
            stack.callback(p.terminate)
            p.start(wait=False)
        for p in processes:
            p.wait_ready()
        yield Hubs(secret, redis_url, processes[3].url, processes)


def root_token(secret: str) -> str:
    """A root credential signed with the hubs' secret: what Hypha's --root-token stands for."""
    issuer = TokenIssuer(secret=secret, clock=SystemClock())
    return issuer.issue(ROOT, workspace="ws-user-root", permission=Permission.ADMIN, expires_in=18000)


def run_file(python: Path, tests: Path, name: str, env: dict[str, str], timeout: float) -> FileResult:
    result = FileResult(name)
    result.left_out = {k.split("::")[1]: why for k, why in LEFT_OUT.items() if k.startswith(f"{name}::")}
    deselect = [f"--deselect=tests/{name}::{test}" for test in result.left_out]
    report = CACHE / "results" / f"{name}.xml"
    log = CACHE / "results" / f"{name}.log"
    report.unlink(missing_ok=True)
    count = max(1, (tests / name).read_text().count("def test_") - len(deselect))
    bound = timeout * count + FILE_GRACE
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(python), "-m", "pytest", f"tests/{name}", f"--timeout={timeout:g}", f"--junitxml={report}", *deselect],
            cwd=tests.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(bound)
        except subprocess.TimeoutExpired:
            result.note = f"stopped after {bound:.0f}s"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    result.seconds = time.monotonic() - started
    if not report.exists():
        result.note = result.note or f"no report (exit {proc.returncode}): see {log}"
        return result
    for case in ET.parse(report).getroot().iter("testcase"):
        test = case.get("name", "?")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            result.failed[test] = first_line(problem.get("message") or problem.text or "")
        elif skipped is not None:
            result.skipped[test] = first_line(skipped.get("message") or "")
        else:
            result.passed.append(test)
    return result


def first_line(text: str) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line[:300]


def report(results: list[FileResult], took: float) -> str:
    lines = [
        "| file | passed | failed | skipped | left out | seconds |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        note = f" ({r.note})" if r.note else ""
        counts = f"{len(r.passed)} | {len(r.failed)} | {len(r.skipped)} | {len(r.left_out)}"
        lines.append(f"| {r.name}{note} | {counts} | {r.seconds:.0f} |")
    total = [sum(len(getattr(r, kind)) for r in results) for kind in ("passed", "failed", "skipped", "left_out")]
    lines.append(f"| **total** | {' | '.join(f'**{n}**' for n in total)} | {took:.0f} |")
    lines.append("")
    for r in results:
        for test, error in r.failed.items():
            lines.append(f"- FAIL {r.name}::{test}: {error}")
        for test, why in r.skipped.items():
            lines.append(f"- skip {r.name}::{test}: {why}")
    lines.append("")
    for r in results:
        for test, why in r.left_out.items():
            lines.append(f"- left out {r.name}::{test}: {why}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="test files of Hypha's tests/ (default: the hub-level ones)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds each test may take (default 180)")
    args = parser.parse_args()
    files = tuple(args.files) or FILES
    python = client_venv()
    tests = hypha_tests()
    unknown = [f for f in files if not (tests / f).exists()]
    if unknown:
        parser.error(f"not among Hypha's tests: {', '.join(unknown)}")
    (CACHE / "results").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = []
    print("starting Valkey, two hubs and two replicas", flush=True)
    with hubs(tests) as running:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE / "shim"), str(ROOT_DIR / "src")]),
            "SWITCHBOARD_JWT_SECRET": running.secret,
            "JWT_SECRET": running.secret,
            "HYPHA_ROOT_TOKEN": root_token(running.secret),
            "HYPHA_SUITE_REDIS_URL": running.redis_url,
            "HYPHA_SUITE_REDIS_2_URL": running.redis_2_url,
        }
        for name in files:
            restarted = running.check()
            result = run_file(python, tests, name, env, args.timeout)
            if restarted:
                result.note = "; ".join(filter(None, [result.note, restarted]))
            results.append(result)
            print(
                f"{name}: {len(result.passed)} passed, {len(result.failed)} failed, "
                f"{len(result.skipped)} skipped ({result.seconds:.0f}s){' ' + result.note if result.note else ''}",
                flush=True,
            )
    text = report(results, time.monotonic() - started)
    (CACHE / "results" / "summary.md").write_text(text + "\n")
    (CACHE / "results" / "summary.json").write_text(json.dumps([r.__dict__ for r in results], indent=2) + "\n")
    print()
    print(text)
    print(f"\nlogs and reports in {CACHE / 'results'}")
    return 0 if all(not r.failed and not r.note for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
