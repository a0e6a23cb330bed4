"""A rolling upgrade: a replica of the previous release (main 8600616, run from its own source) and
one of this release share a hub, and everything that crosses between them is read on both sides.

Calls and replies both ways (client frames, through Redis and then over a link), a manager's call
for an HTTP caller and its reply (a relayed manager call and a manager reply), a workspace
event (a broadcast), and a client's move from one to the other (transit notices).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx
import pytest

from switchboard.testing import ValkeyServer
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually, scaled

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

PREVIOUS = "8600616"  # the release before the replica wire's version field
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def previous_src() -> Iterator[Path]:
    """``src/`` of the previous release, out of this repository's history."""
    if shutil.which("git") is None:
        pytest.skip("git is needed to run the previous release")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS, "src"], capture_output=True, timeout=60, check=False
    )
    if archive.returncode:
        pytest.skip(f"the previous release {PREVIOUS} is not in this clone's history")
    dest = Path(tempfile.mkdtemp(prefix="sb-previous-"))
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    yield dest / "src"
    shutil.rmtree(dest, ignore_errors=True)


@pytest.fixture
def two_releases(previous_src: Path) -> Iterator[tuple[ReplicaProcess, ReplicaProcess]]:
    with ValkeyServer() as valkey:
        old = ReplicaProcess(replica_id="old", redis_url=valkey.url, env={"PYTHONPATH": str(previous_src)})
        new = ReplicaProcess(replica_id="new", redis_url=valkey.url)
        try:
            old.start()
            new.start()
            yield old, new
        finally:
            new.kill()
            old.kill()


def service() -> dict[str, Any]:
    return {"id": "s", "config": {"visibility": "public"}, "add": lambda a, b: a + b, "echo": lambda x: x}


async def test_replicas_of_this_release_and_the_previous_one_read_each_other(two_releases, clients) -> None:
    old, new = two_releases
    on_old = await clients(old.url, client_id="on-old")
    ws = on_old.config["workspace"]
    token = await on_old.generate_token()
    on_new = await clients(new.url, client_id="on-new", token=token)
    await on_old.register_service(service())
    await on_new.register_service(service())

    for caller, provider in ((on_new, "on-old"), (on_old, "on-new")):
        svc = await caller.get_service(f"{provider}:s")
        for n in range(5):  # the first through Redis, the rest over the link it offers
            assert await svc.add(n, 1) == n + 1
        assert await svc.echo(b"\x00" * 100_000) == b"\x00" * 100_000

    async with httpx.AsyncClient(timeout=scaled(20)) as http:
        for via, provider in ((new, "on-old"), (old, "on-new")):  # the manager calls for an HTTP caller
            answer = await http.get(f"{via.url}/{ws}/services/{provider}:s/add", params={"a": 2, "b": 3})
            assert answer.status_code == 200, answer.text
            assert answer.json() == 5

    heard: dict[str, list[Any]] = {"on-old": [], "on-new": []}
    for client in (on_old, on_new):
        client.on("news", heard[client.config["client_id"]].append)
        await client.subscribe(["news"])
    await on_old.emit({"type": "news", "to": "*", "data": {"from": "old"}})
    await on_new.emit({"type": "news", "to": "*", "data": {"from": "new"}})
    await eventually(lambda: all(len(got) == 2 for got in heard.values()), "both events on both replicas")

    # a client moves from the new replica to the old one: the old one hears it left, then is back
    mover = await clients(new.url, client_id="mover", token=token)
    await mover.register_service(service())
    await mover.disconnect()
    mover = await clients(old.url, client_id="mover", token=token)
    await mover.register_service(service())
    assert await (await on_new.get_service("mover:s")).add(1, 1) == 2

    async with httpx.AsyncClient(timeout=scaled(10)) as http:
        metrics = (await http.get(f"{new.url}/metrics")).text
    assert 'switchboard_replica_messages_malformed_total{replica="new"} 0.0' in metrics
    assert 'switchboard_link_frames_received_total{replica="new"} 0.0' not in metrics, "a link was used"
    assert "dropped a" not in old.log_tail(1 << 20), "the previous release read all it was sent"


async def test_balanced_calls_cross_between_this_release_and_the_previous_one(two_releases, clients) -> None:
    """A balanced handle's calls reach an instance on the other release's replica, both ways: this
    release writes a balanced call's handle (and a call that found its instance gone) only where
    the previous release ignores it, never as a frame it would take for a client's."""
    old, new = two_releases
    on_old = await clients(old.url, client_id="on-old")
    token = await on_old.generate_token()
    on_new = await clients(new.url, client_id="on-new", token=token)
    from_new = await clients(new.url, client_id="from-new", token=token)
    from_old = await clients(old.url, client_id="from-old", token=token)

    for instance, caller in ((on_old, from_new), (on_new, from_old)):  # the only instance: across releases
        await instance.register_service(service())
        handle = await caller.get_service("s", {"mode": "balance:round_robin"})
        for n in range(3):  # the first through Redis, the rest over the link it offers
            assert await asyncio.wait_for(handle.add(n, 1), scaled(10)) == n + 1
        assert await asyncio.wait_for(handle.echo(b"\x00" * 100_000), scaled(10)) == b"\x00" * 100_000
        await instance.unregister_service("s")

    assert "dropped a" not in old.log_tail(1 << 20), "the previous release read all it was sent"
