"""``/api/status`` on one replica shows every replica of the hub, from their presence in Valkey."""

from __future__ import annotations

import httpx
import pytest

from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


async def test_each_replica_shows_all_replicas_with_leader_subscriptions_and_rates(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await clients(b.url, client_id="prov")
    await provider.register_service({"id": "pub", "config": {"visibility": "public"}, "f": lambda: 1})
    caller = await clients(a.url, client_id="caller")
    pub = await caller.get_service(f"{provider.config['workspace']}/prov:pub")
    for _ in range(10):
        assert await pub.f() == 1

    async with httpx.AsyncClient(timeout=5) as http:

        async def both() -> dict | None:
            body = (await http.get(f"{a.url}/api/status")).json()
            rows = {r["id"]: r for r in body["replicas"]}
            ready = (
                set(rows) == {"ra", "rb"}
                and rows["rb"]["clients"] == 1
                and rows["rb"]["rates"]["messages_per_second"] > 0
            )
            return body if ready else None

        body = await eventually(both, timeout=15, what="both replicas, rb with its client and traffic")
    rows = {r["id"]: r for r in body["replicas"]}
    assert rows["ra"]["self"] is True
    assert rows["rb"]["self"] is False
    assert sum(r["leader"] for r in rows.values()) == 1
    for row in rows.values():
        subs = row["subscriptions"]
        assert subs["desired"] >= 1
        assert 0 <= subs["confirmed"] <= subs["desired"]
        assert row["bus"] == "ok"
        assert row["address"] == "http://switchboard.test"
    ws = next(w for w in body["workspaces"] if w["id"] == provider.config["workspace"])
    assert [s["service"] for s in ws["services"]] == ["pub"], "the shared registry, seen from the other replica"
