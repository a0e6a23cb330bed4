"""The repository's container image, built and run for real with podman.

No registry can be reached from these machines, so the base image is made here
from Debian packages (``mmdebstrap``: minbase, bookworm, python3, python3-venv,
ca-certificates) and passed to the Dockerfile as its ``BASE``. The base is
cached under ``.cache/container`` and in podman's store, and podman's layer
cache keeps the dependencies' layer, so a second build takes seconds.

Facts of these machines the commands below follow (Debian's podman 4.3): only
runc runs containers (crun refuses the kernel's hybrid cgroups), networking is
the host's (``--network host``: replicas and clients meet on loopback), and the
ulimits must be set below the current ones (raising them is not permitted).
``scripts/container-deps`` installs podman, runc and mmdebstrap.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import time
import tomllib
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "container"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/switchboard:{VERSION}"  # what docs/how-to/kubernetes.md's podman build makes
BASE_REPOSITORY = "localhost/switchboard-test-base"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
PODMAN = ("podman", "--runtime", "runc")
RUN_OPTIONS = ("--network", "host", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096")
TOOLS = ("podman", "runc", "mmdebstrap")

# The host's CA bundle goes into the base, with a pip.conf naming it, so that pip in the
# image build reaches PyPI through whatever TLS proxy this machine trusts. Test base only:
# the Dockerfile's default base brings its own certificates.
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def _run(*args: str, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done


def podman(*args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(*PODMAN, *args, timeout=timeout, check=check)


def _base_key() -> str:
    recipe = f"{SUITE} {','.join(PACKAGES)}\n".encode()
    ca = HOST_CA.read_bytes() if HOST_CA.exists() else b""
    return hashlib.sha256(recipe + ca).hexdigest()[:16]


def base_image() -> str:
    """The Debian base, built once (about 45 s here, 225 MB), then reused."""
    key = _base_key()
    name = f"{BASE_REPOSITORY}:{key}"
    if podman("image", "exists", name, check=False).returncode == 0:
        return name
    tar = CACHE / f"base-{key}.tar"
    if not tar.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = tar.with_name(f"{tar.stem}.{os.getpid()}.partial.tar")  # mmdebstrap: a tar by its name
        hooks = []
        if HOST_CA.exists():
            hooks = [
                f"--customize-hook=upload {HOST_CA} /etc/ssl/certs/ca-certificates.crt",
                "--customize-hook=printf '[global]\\ncert = /etc/ssl/certs/ca-certificates.crt\\n' > \"$1/etc/pip.conf\"",
            ]
        _run(
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            *hooks,
            SUITE,
            str(partial),
            timeout=600,
        )
        partial.rename(tar)
    podman("import", str(tar), name, timeout=120)
    return name


def build_image(base: str) -> str:
    """``podman build`` of the repository's Dockerfile on ``base``, tagged as docs/how-to/kubernetes.md says.

    The image it replaces (the source changed) is removed, so that runs do not pile up copies."""
    replaced = podman("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout.strip()
    podman(
        "build",
        "--format",
        "docker",  # the OCI format has no HEALTHCHECK
        "--network",
        "host",
        "--build-arg",
        f"BASE={base}",
        "--tag",
        IMAGE,
        str(ROOT),
        timeout=900,
    )
    if replaced and replaced != podman("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip():
        podman("rmi", replaced, check=False)  # refused while a container still uses it: left alone
    return IMAGE


class Container:
    """One ``podman run -d`` of the image on the host's network, serving on ``port``.

    Not removed when it exits, so its exit code can be read; :meth:`remove` does that.
    """

    def __init__(
        self,
        image: str,
        *,
        port: int,
        env: dict[str, str] | None = None,
        name: str = "hub",
        options: tuple[str, ...] = (),
    ) -> None:
        self.image = image
        self.options = options
        self.port = port
        self.env = {"SWITCHBOARD_PORT": str(port), **(env or {})}
        self.name = f"sb-test-{name}-{uuid.uuid4().hex[:8]}"
        self.stop_took = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Container:
        env = [arg for key, value in self.env.items() for arg in ("--env", f"{key}={value}")]
        podman("run", "--detach", "--name", self.name, *RUN_OPTIONS, *self.options, *env, self.image, timeout=60)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=0.5) as http:  # one for all the looks (a new one costs 20 ms of CPU)
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.url}/health/readiness").status_code == 200:
                        return
                if self.state() != "running":
                    raise RuntimeError(f"container {self.name} is {self.state()}:\n{self.logs()}")
                time.sleep(0.1)
        raise RuntimeError(f"container {self.name} not ready within {timeout} s:\n{self.logs()}")

    def state(self) -> str:
        return podman("inspect", "--format", "{{.State.Status}}", self.name, check=False).stdout.strip()

    def exit_code(self) -> int:
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", self.name).stdout.strip())

    def stop(self, grace: int = 10) -> float:
        """``podman stop``: SIGTERM, and SIGKILL after ``grace`` seconds. Returns the seconds from
        the call to the container's exit (podman's start counted, its cleanup after the exit not:
        that is podman's work, not the hub's); ``stop_took`` is how long the whole command took."""
        called = time.time()
        started = time.monotonic()
        podman("stop", "--time", str(grace), self.name, timeout=grace + 30)
        self.stop_took = time.monotonic() - started
        finished = int(podman("inspect", "--format", "{{.State.FinishedAt.UnixNano}}", self.name).stdout) / 1e9
        return finished - called

    def healthcheck(self) -> subprocess.CompletedProcess[str]:
        """Run the image's HEALTHCHECK once (podman's timer for it needs systemd)."""
        return podman("healthcheck", "run", self.name, check=False)

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *command, check=False)

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return (done.stdout + done.stderr)[-6000:]

    def remove(self) -> None:
        podman("rm", "--force", "--volumes", "--time", "0", self.name, check=False)  # and its state volume


def ci_requires_tools() -> bool:
    return os.environ.get("CI") == "true"
