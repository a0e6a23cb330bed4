"""Limits keep one client from hurting the others; each refusal says which limit and why."""

from __future__ import annotations

import asyncio

import pytest
from hypha_rpc import connect_to_server

from support.tokens import credential
from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)


async def test_connections_per_user_are_capped_with_a_clear_refusal():
    async with running(settings_for_tests(max_connections_per_user=2)) as srv:
        owner = await connect_to_server({"server_url": srv.url, "client_id": "owner"})
        token = await owner.generate_token()  # its holders count as its maker, the owner
        first = await connect_to_server({"server_url": srv.url, "client_id": "w1", "token": token})
        with pytest.raises(ConnectionAbortedError, match=r"Too many connections for user .* \(limit 2\)"):
            await connect_to_server({"server_url": srv.url, "client_id": "w2", "token": token})
        await first.disconnect()

        # the slot frees when the server has seen the close
        async def second_connection():
            return await connect_to_server({"server_url": srv.url, "client_id": "w2", "token": token})

        second = await eventually(second_connection, "a slot for a second connection")
        assert await second.echo("in") == "in"
        for client in (second, owner):
            await client.disconnect()


async def test_tokens_a_user_generates_share_its_connection_quota():
    async with running(settings_for_tests(max_connections_per_user=2)) as srv:
        alice = await connect_to_server(
            {"server_url": srv.url, "client_id": "alice", "token": credential("alice", 600)[0]}
        )
        minted = [await alice.generate_token() for _ in range(2)]  # each a new user id, whose parent is alice
        worker = await connect_to_server({"server_url": srv.url, "client_id": "w1", "token": minted[0]})
        with pytest.raises(ConnectionAbortedError, match=r"Too many connections for user alice \(limit 2\)"):
            await connect_to_server({"server_url": srv.url, "client_id": "w2", "token": minted[1]})
        for client in (worker, alice):
            await client.disconnect()


async def test_connections_per_workspace_are_capped():
    async with running(settings_for_tests(max_connections_per_workspace=2)) as srv:
        owner = await connect_to_server({"server_url": srv.url, "client_id": "owner"})
        token = await owner.generate_token()
        guest = await connect_to_server({"server_url": srv.url, "client_id": "g1", "token": token})
        with pytest.raises(ConnectionAbortedError, match=r"Too many connections for workspace"):
            await connect_to_server({"server_url": srv.url, "client_id": "g2", "token": token})
        elsewhere = await connect_to_server({"server_url": srv.url, "client_id": "other"})  # own workspace
        assert await elsewhere.echo(1) == 1
        for client in (elsewhere, guest, owner):
            await client.disconnect()


async def test_a_flooding_client_is_held_to_its_rate_and_others_do_not_notice():
    async with running(settings_for_tests(max_messages_per_second=20, message_burst=40)) as srv:
        flood = await connect_to_server({"server_url": srv.url, "client_id": "flood", "method_timeout": 10})
        calm = await connect_to_server({"server_url": srv.url, "client_id": "calm"})
        results = await asyncio.gather(*(flood.echo(i) for i in range(150)), return_exceptions=True)
        refused = [r for r in results if isinstance(r, Exception)]
        assert refused, "some calls must be refused"
        assert all("Rate limit exceeded" in str(r) for r in refused)
        assert len(refused) < 150
        assert await calm.echo("fine") == "fine"
        for client in (flood, calm):
            await client.disconnect()


async def test_pending_calls_per_client_are_capped():
    async with running(settings_for_tests(max_pending_calls=3)) as srv:
        provider = await connect_to_server({"server_url": srv.url, "client_id": "prov"})
        release = asyncio.Event()

        async def wait():
            await release.wait()
            return "done"

        await provider.register_service({"id": "s", "config": {"visibility": "public"}, "wait": wait})
        caller = await connect_to_server({"server_url": srv.url, "client_id": "caller"})
        svc = await caller.get_service(f"{provider.config['workspace']}/prov:s")
        waiting = [asyncio.ensure_future(svc.wait()) for _ in range(3)]
        caller_id = f"{caller.config['workspace']}/caller"
        await eventually(lambda: srv.hub.inflight.pending(caller_id) == 3, "three calls pending", timeout=2.0)
        with pytest.raises(Exception, match="Too many pending calls"):
            await svc.wait()
        release.set()
        assert await asyncio.gather(*waiting) == ["done"] * 3
        assert await svc.wait() == "done"  # room again once replies came back
        for client in (caller, provider):
            await client.disconnect()


async def test_a_provider_over_its_rate_still_delivers_every_reply():
    """Replies answer calls that are open: refusing them would hang innocent callers."""
    async with running(settings_for_tests(max_messages_per_second=10, message_burst=30)) as srv:
        provider = await connect_to_server({"server_url": srv.url, "client_id": "prov"})
        await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda x: x})
        callers = [
            await connect_to_server({"server_url": srv.url, "client_id": f"c{i}", "method_timeout": 10})
            for i in range(4)
        ]
        ws = provider.config["workspace"]
        services = [await c.get_service(f"{ws}/prov:s") for c in callers]
        # each caller stays within its own rate; together they push the provider past its rate
        results = await asyncio.gather(*(svc.f(i) for svc in services for i in range(15)))
        assert sorted(results) == sorted(i for _ in services for i in range(15))
        assert srv.hub.metrics.rate_limited._value.get() == 0  # nothing anyone sent was refused
        for client in (*callers, provider):
            await client.disconnect()
