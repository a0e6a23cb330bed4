"""Messages too large for one frame (hypha-rpc chunks them above 256 KiB) between replicas.

hypha-rpc sends a large message as calls to the receiver's ``message_cache``
service. When the receiver is the manager (``*/<manager_id>``, hosted by every
replica), those calls must reach the replica whose manager made the call the
large message answers, like the final ``<session>.resolve`` does.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

MIB = 1024 * 1024


def big_service(bulk_in: str, size: int = MIB) -> dict:
    """A public service whose description (as ``get_service`` returns it) is ``size`` bytes larger."""
    service = {
        "id": "big",
        "name": "big",
        "config": {"visibility": "public"},
        "echo": lambda x: x,
        "give": lambda n: "y" * n,
    }
    if bulk_in == "docs":
        service["docs"] = "d" * size
    else:
        service["config"]["blob"] = "c" * size
    return service


def bulk_of(service, bulk_in: str) -> str:
    return service["docs"] if bulk_in == "docs" else service["config"]["blob"]


async def provider_on(replica, clients, bulk_in: str):
    provider = await clients(replica.url, client_id="prov")
    await provider.register_service(big_service(bulk_in))
    return provider


@pytest.mark.parametrize("bulk_in", ["docs", "config"])
@pytest.mark.parametrize("caller_on", ["same", "other"])
async def test_get_service_returns_a_large_service_description_from_any_replica(replicas, clients, bulk_in, caller_on):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await provider_on(a, clients, bulk_in)
    token = await provider.generate_token()
    caller = await clients((a if caller_on == "same" else b).url, client_id="caller", token=token)
    try:
        svc = await asyncio.wait_for(caller.get_service("prov:big", {"timeout": 15}), 30)
    except Exception as exc:  # show what each replica saw, not only the caller's timeout
        raise AssertionError(f"{exc!r}\n--- A ---\n{a.log_tail()}\n--- B ---\n{b.log_tail()}") from exc
    assert len(bulk_of(svc, bulk_in)) == MIB
    assert await svc.echo(41) == 41
    assert len(await svc.give(MIB)) == MIB  # a large result travels client to client as well


async def test_a_large_service_from_another_replica_can_be_fetched_again_and_concurrently(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await provider_on(a, clients, "docs")
    callers = [await clients(b.url, client_id=f"caller{i}", token=await provider.generate_token()) for i in range(2)]
    fetches = [c.get_service("prov:big", {"timeout": 15}) for c in callers for _ in range(2)]
    got = await asyncio.wait_for(asyncio.gather(*fetches), 45)
    assert [len(s["docs"]) for s in got] == [MIB] * 4
    assert [await s.echo(i) for i, s in enumerate(got)] == [0, 1, 2, 3]


async def test_manager_results_larger_than_a_frame_about_another_replicas_service(replicas, clients):
    """``get_service_info`` and ``list_services`` answer from the registry: large, but local replies."""
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await provider_on(a, clients, "docs")
    ws = provider.config["workspace"]
    caller = await clients(b.url, client_id="caller", token=await provider.generate_token())
    info = await caller.get_service_info("prov:big")
    assert info["id"] == f"{ws}/prov:big"
    assert len(info["docs"]) == MIB  # stored with the registration: the reply is chunked
    listed = await caller.list_services({"workspace": ws})
    assert [len(s["docs"]) for s in listed if s["id"] == f"{ws}/prov:big"] == [MIB]
    # and as large arguments to the manager: an echo of 1 MiB there and back
    assert len(await caller.echo("e" * MIB)) == MIB


async def post(replica, path: str, body: dict, token: str, *, timeout: float = 40) -> httpx.Response:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        return await http.post(f"{replica.url}{path}", json=body, timeout=timeout)


@pytest.mark.parametrize("http_on", ["same", "other"])
async def test_an_http_call_returns_a_large_result_of_a_large_service_on_any_replica(replicas, clients, http_on):
    """HTTP calls are made by the manager's RPC acting as the HTTP caller: a large result
    comes back to it in chunks, after the provider asked the caller's address for its
    built-in service (the ``message_cache`` the chunks go to)."""
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await provider_on(a, clients, "docs")
    ws = provider.config["workspace"]
    token = await provider.generate_token()
    via = a if http_on == "same" else b
    for n in (MIB, 3):  # a large result, then a small one through the same path
        response = await post(via, f"/{ws}/services/prov:big/give", {"n": n}, token)
        assert response.status_code == 200, (
            f"{response.text[:500]}\n--- A ---\n{a.log_tail()}\n--- B ---\n{b.log_tail()}"
        )
        assert response.json() == "y" * n


async def test_an_http_call_with_a_large_argument(replicas, clients):
    a = replicas.start("ra", "--call-timeout", "5")
    provider = await provider_on(a, clients, "docs")
    token = await provider.generate_token()
    ws = provider.config["workspace"]
    response = await post(a, f"/{ws}/services/prov:big/echo", {"x": "e" * MIB}, token, timeout=20)
    assert response.status_code == 200, response.text[:500]
    assert response.json() == "e" * MIB
