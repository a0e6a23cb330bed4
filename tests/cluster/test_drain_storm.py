"""A drain moves hundreds of clients to the sibling within the grace, none announced gone (issue 26).

Two real replicas on one Valkey; 500 Switchboard SDK clients (both URLs, one
registered service each, all in one workspace) on replica A; on B, a client
watching ``client_disconnected``. A gets SIGTERM, as in a rolling restart:
every client must be back on B (its owner in Redis), listed and callable,
before any grace runs out, so nobody is announced gone. Sent all at once, the
reconnections queue on B and the last ones are back after the grace; the
drain's waves (``--drain-window``) keep each one's time from its own
hand-over short.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import httpx
import pytest

from switchboard.client import connect
from switchboard.hub.identity.users import user_workspace
from switchboard.testing.crowd import admin_token
from switchboard.testing.wait import eventually, scaled

pytestmark = [pytest.mark.cluster, pytest.mark.alone, pytest.mark.timeout(150)]

CLIENTS = 500
GRACE = 5.0  # --transit-grace, the default (times the machine's test time scale)
CONNECTING = 32  # clients connecting at a time
USER = "storm-user"


def owners(redis_server: Any, ids: set[str]) -> dict[str, str]:
    with redis_server.client() as r:
        return {k.decode(): v.decode() for k, v in r.hgetall("sb:owner").items() if k.decode() in ids}


async def transit_figures(url: str) -> tuple[int, int]:
    """B's metrics: clients that came back from transit (one back before its mark was written counts
    in neither), and graces that ran out first."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics", timeout=5)).text
    figures = {"count": 0.0, "expired": 0.0}
    for line in text.splitlines():
        if line.startswith("switchboard_transit_seconds_count"):
            figures["count"] = float(line.split()[-1])
        elif line.startswith("switchboard_transit_expiries_total"):
            figures["expired"] = float(line.split()[-1])
    return int(figures["count"]), int(figures["expired"])


async def test_500_clients_move_to_the_sibling_within_the_grace_and_none_is_announced_gone(
    replicas: Any, redis_server: Any
) -> None:
    args = ["--transit-grace", str(scaled(GRACE)), "--max-connections-per-workspace", str(CLIENTS + 50)]
    a, b = replicas.start("ra", *args), replicas.start("rb", *args)
    workspace, token = user_workspace(USER), admin_token(USER)
    gate = asyncio.Semaphore(CONNECTING)
    made: list[Any] = []

    async def one(i: int) -> None:
        async with gate:
            client = await connect([a.url, b.url], client_id=f"c{i}", workspace=workspace, token=token)
            made.append(client)
            await client.register_service({"id": "s", "config": {"visibility": "protected"}, "echo": lambda x: x})

    watcher = await connect([b.url], client_id="watcher", workspace=workspace, token=token)
    made.append(watcher)
    try:
        gone: list[Any] = []
        watcher.on("client_disconnected", gone.append)
        await watcher.subscribe(["client_disconnected"])
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(CLIENTS))), scaled(90))
        everyone = {f"{workspace}/c{i}" for i in range(CLIENTS)}
        await eventually(lambda: len(owners(redis_server, everyone)) == CLIENTS, "every client registered")
        # a client whose first connect to A timed out on a loaded machine is on B already: it stays
        ids = {cid for cid, owner in owners(redis_server, everyone).items() if owner == "ra"}
        assert len(ids) >= CLIENTS * 0.9, f"only {len(ids)} of {CLIENTS} clients on A"

        started = time.monotonic()
        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)
        await eventually(
            lambda: list(owners(redis_server, ids).values()).count("rb") == len(ids),
            "every client back on B",
            timeout=scaled(30),
            interval=0.1,
        )
        took = time.monotonic() - started
        assert await asyncio.to_thread(a.proc.wait, scaled(30)) == 0
        back, expired = await transit_figures(b.url)
        assert (expired, gone) == (0, []), (
            f"{expired} of {len(ids)} clients moved were announced gone, back after their grace "
            f"({len(gone)} client_disconnected seen, {back} back in time); all on B {took:.1f} s after SIGTERM"
        )
        listed = await watcher.list_services({"workspace": workspace})
        assert {s["id"] for s in listed if s["id"].endswith(":s")} == {f"{cid}:s" for cid in everyone}
        for cid in sorted(ids)[::50]:  # a sample, each through B
            svc = await watcher.get_service(f"{cid}:s")
            assert await svc.echo(cid) == cid
        print(f"{len(ids)} clients back on B {took:.2f} s after SIGTERM, none announced gone")
    finally:
        await asyncio.gather(*(asyncio.wait_for(c.disconnect(), 5) for c in made), return_exceptions=True)
