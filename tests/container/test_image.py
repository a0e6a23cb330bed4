"""The Dockerfile's image runs the hub the way deploy/ runs it: built and run for real with podman.

The hub runs in a container on the host's network; the clients are unmodified
hypha-rpc clients on the host, and the two-replica hub shares a real Valkey on
the host. Traffic goes over loopback only.
"""

from __future__ import annotations

import asyncio

import pytest

from support.containers import Container
from switchboard.testing import ValkeyServer
from switchboard.testing.balancer import Balancer
from switchboard.testing.ports import free_port
from switchboard.testing.wait import eventually, scaled

# the first test also builds the image: about 2 minutes from nothing, seconds from the cache
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(900)]

STATE_DIR = "/var/lib/switchboard"


async def _calculator(clients, url: str, client_id: str = "provider"):
    provider = await clients(url, client_id=client_id)
    await provider.register_service({"id": "calc", "config": {"visibility": "public"}, "add": lambda a, b: a + b})
    return provider


async def test_the_hub_is_pid_1_as_a_non_root_user_listening_on_every_interface(containers):
    # read-only root file system, as deploy/switchboard.yaml asks: only the state volume is written
    hub: Container = await asyncio.to_thread(containers, "solo", options=("--read-only", "--read-only-tmpfs=false"))
    assert f"ready at http://0.0.0.0:{hub.port}" in hub.logs()
    assert hub.exec("id", "-u").stdout.strip() == "10001"
    pid_1 = hub.exec("cat", "/proc/1/cmdline").stdout.split("\0")
    assert [word.rsplit("/", 1)[-1] for word in pid_1[1:3]] == ["switchboard", "serve"], f"PID 1: {pid_1}"
    assert hub.exec("touch", f"{STATE_DIR}/written").returncode == 0, "the state volume is not the hub's to write"
    assert hub.exec("printenv", "SWITCHBOARD_STATE_DIR").stdout.strip() == STATE_DIR
    healthcheck = await asyncio.to_thread(hub.healthcheck)
    assert healthcheck.returncode == 0, f"the image's HEALTHCHECK failed: {healthcheck.stdout}{healthcheck.stderr}"
    exited = await asyncio.to_thread(hub.stop)  # podman stop: SIGTERM, SIGKILL after 10 s
    assert hub.exit_code() == 0, hub.logs()
    assert exited < scaled(2.0), f"exited {exited:.2f} s after podman stop:\n{hub.logs()}"
    print(f"podman stop of an idle hub: exited after {exited:.2f} s, podman stop took {hub.stop_took:.2f} s")


async def test_unmodified_hypha_rpc_clients_on_the_host_call_each_other_through_a_hub_in_a_container(
    containers, clients
):
    hub: Container = await asyncio.to_thread(containers, "solo")
    provider = await _calculator(clients, hub.url)
    caller = await clients(hub.url, client_id="caller")
    calc = await caller.get_service(f"{provider.config['workspace']}/provider:calc")
    assert await calc.add(2, 3) == 5


def _owner(valkey: ValkeyServer, client_id: str) -> str | None:
    owners = {k.decode(): v.decode() for k, v in valkey.client().hgetall("sb:owner").items()}
    return next((replica for key, replica in owners.items() if key.endswith(f"/{client_id}")), None)


async def test_two_containers_on_a_valkey_are_one_hub_and_sigterm_moves_their_clients_to_the_sibling(
    containers, clients
):
    port_a, port_b = free_port(), free_port()
    with ValkeyServer() as valkey:
        async with Balancer([port_a, port_b]) as balancer:  # what a Kubernetes Service is to the pods
            env = {
                "SWITCHBOARD_REDIS_URL": valkey.url,
                "SWITCHBOARD_PUBLIC_URL": balancer.url,
                "SWITCHBOARD_LINK_ADVERTISE": "127.0.0.1",  # links on loopback, not the host's address
            }
            a, b = await asyncio.gather(
                asyncio.to_thread(containers, "a", port=port_a, env={**env, "SWITCHBOARD_REPLICA_ID": "a"}),
                asyncio.to_thread(containers, "b", port=port_b, env={**env, "SWITCHBOARD_REPLICA_ID": "b"}),
            )
            balancer.take_out(port_b)
            provider = await _calculator(clients, balancer.url)
            balancer.put_back(port_b)
            balancer.take_out(port_a)  # as a terminating pod leaves its Service's endpoints
            caller = await clients(balancer.url, client_id="caller")
            assert (_owner(valkey, "provider"), _owner(valkey, "caller")) == ("a", "b")

            calc = await caller.get_service(f"{provider.config['workspace']}/provider:calc")
            assert await calc.add(2, 3) == 5  # from b to a

            exited = await asyncio.to_thread(a.stop)  # podman stop: SIGTERM, SIGKILL after 10 s
            assert await asyncio.to_thread(a.exit_code) == 0, a.logs()  # the clients move meanwhile
            assert exited < scaled(2.0), f"exited {exited:.2f} s after podman stop:\n{a.logs()}"
            await eventually(lambda: _owner(valkey, "provider") == "b", "the provider moved to b", timeout=10)
            assert await calc.add(4, 5) == 9  # the same reference, now within b
            assert b.state() == "running"
            await asyncio.gather(caller.disconnect(), provider.disconnect())
            print(
                f"podman stop of a replica with a client to move: exited after {exited:.2f} s, podman stop took {a.stop_took:.2f} s"
            )
