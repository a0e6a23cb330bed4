"""Fixtures for the container image tests: the repository's Dockerfile, built once per module with podman.

``scripts/container-deps`` (run by ``scripts/test``) installs podman, runc and
mmdebstrap with apt if they are missing. Without them these tests are skipped,
except under ``CI=true``, where they fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from support.containers import Container, base_image, build_image, ci_requires_tools, missing_tools
from switchboard.testing.ports import free_port

# At least 32 bytes: the shared secret the replicas sign tokens with (a short one is refused)
SECRET = "container-tests-shared-secret-0123456789"


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built from the Dockerfile on a Debian base made here (cached under .cache/container)."""
    missing = missing_tools()
    if missing:
        message = f"container tests need {', '.join(missing)}: run scripts/container-deps"
        if ci_requires_tools():
            pytest.fail(message)
        pytest.skip(message)
    return build_image(base_image())


StartContainer = Callable[..., Container]


@pytest.fixture
def containers(image: str) -> Iterator[StartContainer]:
    """``containers(name, port=..., env=..., options=...)``: a started hub in a container, removed at the end."""
    started: list[Container] = []

    def start(
        name: str, *, port: int | None = None, env: dict[str, str] | None = None, options: tuple[str, ...] = ()
    ) -> Container:
        container = Container(
            image,
            port=port or free_port(),
            env={"SWITCHBOARD_JWT_SECRET": SECRET, **(env or {})},
            name=name,
            options=options,
        )
        started.append(container)
        return container.start()

    yield start
    for container in started:
        container.remove()
