"""Choosing among services whose providers sit on two replicas (real processes on a real Valkey)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from hypha_rpc.rpc import RemoteException

from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

TRIES = 12  # a coin would miss within a dozen picks (1 in 4096 to pass by luck)


async def _setup(replicas, clients):
    """``near`` (p0) on replica A with the caller, ``far`` (p1) on replica B; both serve ``calc``."""
    a, b = replicas.start("ra"), replicas.start("rb")
    near = await clients(a.url, client_id="p0")
    token = await near.generate_token()
    far = await clients(b.url, client_id="p1", token=token)
    release = asyncio.Event()

    async def hold():
        await release.wait()

    def broken():
        raise RuntimeError("not today")

    await near.register_service({"id": "calc", "who": lambda: 0, "load": lambda: 7, "ready": broken, "hold": hold})
    await far.register_service({"id": "calc", "who": lambda: 1, "load": lambda: 3, "ready": lambda: 1, "hold": hold})
    caller = await clients(a.url, client_id="caller", token=token)
    return a, b, caller, token, release


async def _who(api, mode):
    return await (await api.get_service("calc", {"mode": mode})).who()


async def test_every_mode_with_candidates_on_both_replicas(replicas, clients):
    a, b, caller, token, _ = await _setup(replicas, clients)
    with pytest.raises(RemoteException, match="Multiple services found"):
        await caller.get_service("calc")
    with pytest.raises(RemoteException, match="Invalid mode: fastest"):
        await caller.get_service("calc", {"mode": "fastest"})
    assert {await _who(caller, "first"), await _who(caller, "last")} == {0, 1}
    seen = set()
    for _ in range(40):
        seen.add(await _who(caller, "random"))
        if len(seen) == 2:
            break
    assert seen == {0, 1}
    for _ in range(3):
        assert await _who(caller, "select:min:load") == 1  # the far one answers 3, the near one 7
        assert await _who(caller, "select:max:load") == 0
        assert await _who(caller, "select:first_success:ready") == 1  # the near one fails
    info = await caller.get_service_info("calc", {"mode": "select:min:load", "select_timeout": 1})
    assert info["id"].endswith("/p1:calc")


async def test_native_random_prefers_the_callers_replica(replicas, clients):
    a, b, caller, token, _ = await _setup(replicas, clients)
    other = await clients(b.url, client_id="caller-b", token=token)
    for _ in range(TRIES):
        assert await _who(caller, "native:random") == 0  # caller and p0 on A
        assert await _who(other, "native:random") == 1  # caller-b and p1 on B


async def test_min_load_picks_the_instance_with_fewer_calls_in_flight(replicas, clients):
    a, b, caller, token, release = await _setup(replicas, clients)
    holder = await clients(a.url, client_id="holder", token=token)
    ws = caller.config["workspace"]

    async def always(expected: int) -> bool:
        for _ in range(TRIES):
            if await _who(caller, "min_load") != expected:
                return False
        return True

    # calls held open on the far provider: counted on B, published in B's presence, read on A
    far = await holder.get_service(f"{ws}/p1:calc")
    held = [asyncio.ensure_future(far.hold()) for _ in range(3)]
    try:
        await eventually(lambda: always(0), "min_load to keep choosing the idle near provider", timeout=20)
    finally:
        release.set()
        await asyncio.gather(*held)
    release.clear()
    # and the other way round: calls held on the near one, counted where the lookup runs (the
    # far one's published count takes up to a presence interval to fall back to zero)
    near = await holder.get_service(f"{ws}/p0:calc")
    held = [asyncio.ensure_future(near.hold()) for _ in range(3)]
    try:
        await eventually(lambda: always(1), "min_load to keep choosing the idle far provider", timeout=20)
    finally:
        release.set()
        await asyncio.gather(*held)


async def test_singleton_tilde_and_patterns_across_replicas(replicas, clients):
    a, b, caller, token, _ = await _setup(replicas, clients)
    ws = caller.config["workspace"]
    solo = await clients(a.url, client_id="solo-a", token=token)
    await solo.register_service({"id": "solo", "config": {"singleton": True}, "f": lambda: 1})
    rival = await clients(b.url, client_id="solo-b", token=token)
    with pytest.raises(Exception, match=r"A singleton service with the same name \(solo\)"):
        await rival.register_service({"id": "solo", "f": lambda: 2})
    manager = await rival.get_service("~")
    found = await manager.list_services({"service_id": "ca*"})
    assert sorted(s["id"] for s in found) == [f"{ws}/p0:calc", f"{ws}/p1:calc"]
    assert (await rival.get_service_info(f"{ws}/~"))["id"] == "~"


async def test_a_client_on_one_replica_is_not_found_by_an_outsider_on_the_other(replicas, clients):
    """Presence across replicas: the built-in services of W's clients on A (read from the shared
    registry on B) are not there for an outsider of W on B, by any mode or door; a reader on B finds them."""
    a, b, caller, token, _ = await _setup(replicas, clients)
    ws = caller.config["workspace"]
    outsider = await clients(b.url)
    for mode in ("last", "random", "min_load", "select:max:load"):
        with pytest.raises(RemoteException, match="Service not found"):
            await outsider.get_service_info(f"{ws}/*:built-in", {"mode": mode})
    with pytest.raises(RemoteException, match="Service not found"):
        await outsider.get_service_info(f"{ws}/caller:built-in")
    async with httpx.AsyncClient(base_url=b.url, timeout=10) as http:
        for path in ("*:built-in?_mode=random", "caller:built-in", "*:built-in/ping?_mode=last"):
            answer = await http.get(f"/{ws}/services/{path}")
            assert answer.status_code == 404, (path, answer.text)
            assert "created_by" not in answer.text
        seen = await http.get(f"/{ws}/services/caller:built-in", headers={"Authorization": f"Bearer {token}"})
        assert seen.status_code == 200, seen.text
        assert seen.json()["id"] == f"{ws}/caller:built-in"
