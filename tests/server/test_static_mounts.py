"""``--static-mounts PATH:DIR`` serves a directory, as Hypha's option, and nothing outside it.

The attacker's requests go out as raw bytes: an HTTP client would remove the
``..`` segments before sending them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from switchboard.config import Settings, parse_static_mounts
from switchboard.errors import ConfigError
from switchboard.server.app import create_app
from switchboard.server.runner import RunningServer
from switchboard.testing.hub import settings_for_tests
from switchboard.testing.wait import scaled

pytestmark = pytest.mark.timeout(30)

SECRET = "the-secret-outside-the-mount"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """``/docs`` serves ``site``; beside it a secret, and links from ``site`` out to it."""
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "index.html").write_text("<h1>home</h1>")
    (site / "a.txt").write_text("alpha")
    (site / "sub" / "b.txt").write_text("beta")
    (tmp_path / "secret.txt").write_text(SECRET)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    os.symlink(tmp_path / "secret.txt", site / "link.txt")
    os.symlink(outside, site / "linkdir")
    os.symlink(site / "a.txt", site / "inside.txt")  # a link that stays inside is a file like any other
    return settings_for_tests(static_mounts=f"/docs:{site}")


async def raw_get(url: str, target: str) -> tuple[int, str]:
    """``GET target`` sent as written (no normalisation): the status and the body."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), scaled(10))  # to the end: the hub closes after it
    finally:
        writer.close()
    head, _, body = answer.decode(errors="replace").partition("\r\n\r\n")
    return int(head.split()[1]), body


async def test_a_mounted_directory_is_served_at_its_path(server: RunningServer):
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        assert (await http.get("/docs/a.txt")).text == "alpha"
        assert (await http.get("/docs/sub/b.txt")).text == "beta"
        assert (await http.get("/docs/inside.txt")).text == "alpha"
        home = await http.get("/docs/")
        assert home.status_code == 200
        assert home.text == "<h1>home</h1>"
        assert home.headers["content-type"].startswith("text/html")
        assert (await http.get("/docs/missing.txt")).status_code == 404
        assert (await http.get("/health")).json()["status"] == "HEALTHY"  # the hub's own routes unchanged


@pytest.mark.parametrize(
    "target",
    [
        "/docs/../secret.txt",
        "/docs/sub/../../secret.txt",
        "/docs/%2e%2e/secret.txt",
        "/docs/%2E%2E/secret.txt",
        "/docs/..%2fsecret.txt",
        "/docs/%2e%2e%2fsecret.txt",
        "/docs/sub/%2e%2e/%2e%2e/secret.txt",
        "/docs/..%5csecret.txt",
        "/docs/link.txt",
        "/docs/linkdir/secret.txt",
    ],
)
async def test_nothing_outside_the_mounted_directory_is_served(server: RunningServer, target: str):
    status, body = await raw_get(server.url, target)
    assert SECRET not in body
    assert status in (400, 404), (status, body[:200])


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("docs:/tmp", "one top-level segment"),
        ("/a/b:/tmp", "one top-level segment"),
        ("/docs", "PATH:DIR"),
        ("/docs:", "PATH:DIR"),
        ("/health:/tmp", "the hub's own routes"),
        ("/ws:/tmp", "the hub's own routes"),
        ("/docs:/tmp,/docs:/srv", "mounted twice"),
    ],
)
def test_a_malformed_mount_is_refused_when_the_settings_are_read(spec: str, says: str):
    with pytest.raises(ConfigError, match=says):
        settings_for_tests(static_mounts=spec)


def test_a_mount_of_a_missing_directory_is_refused_at_start(tmp_path: Path):
    with pytest.raises(ConfigError, match="is not a directory"):
        create_app(settings_for_tests(static_mounts=f"/docs:{tmp_path / 'nowhere'}"))


def test_several_mounts_are_comma_separated():
    mounts = parse_static_mounts(" /docs:./site , /img:/srv/img ")
    assert [(m.path, m.directory) for m in mounts] == [("/docs", "./site"), ("/img", "/srv/img")]
    assert parse_static_mounts("") == []
