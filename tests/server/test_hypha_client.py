"""An unmodified hypha-rpc 0.21.47 client uses the hub: the issue's eight must-work items."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from hypha_rpc.rpc import RemoteException

from switchboard.testing.hub import settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)


# 1. connecting --------------------------------------------------------------


async def test_anonymous_connect_names_workspace_client_and_manager(connect):
    api = await connect(client_id="alice")
    assert api.config["workspace"].startswith("ws-user-anonymouz-")
    assert api.config["client_id"] == "alice"
    assert api.config["manager_id"] == "manager-switchboard"
    assert api.config["user"]["is_anonymous"] is True


async def test_connect_with_a_generated_token_joins_that_workspace(connect):
    owner = await connect(client_id="owner")
    token = await owner.generate_token()
    guest = await connect(client_id="guest", token=token)
    assert guest.config["workspace"] == owner.config["workspace"]
    assert guest.config["user"]["id"] != owner.config["user"]["id"]
    assert guest.config["user"]["parent"] == owner.config["user"]["id"]


async def test_every_manager_method_carries_a_schema_named_after_it(connect):
    api = await connect()
    for name in ("register_service", "get_service", "list_services", "generate_token", "echo"):
        assert getattr(api, name).__schema__["name"] == name


# 2. registering and finding services ---------------------------------------


async def test_public_and_protected_services_found_by_full_and_short_id(connect):
    provider = await connect(client_id="prov")
    ws = provider.config["workspace"]

    async def add(a, b):
        return a + b

    await provider.register_service(
        {"id": "pub", "config": {"visibility": "public"}, "add": add, "mul": lambda a, b: a * b}
    )
    await provider.register_service({"id": "prot", "config": {"visibility": "protected"}, "f": lambda: 1})
    token = await provider.generate_token()
    peer = await connect(client_id="peer", token=token)
    for sid in ("pub", "prov:pub", "*:pub", f"{ws}/pub", f"{ws}/prov:pub", f"{ws}/prov:pub@*"):
        svc = await peer.get_service(sid)
        assert svc.id == f"{ws}/prov:pub"
        assert svc.config.workspace == ws
        assert svc.config.url == f"{peer.config['public_base_url']}/{ws}/services/prov:pub"
    svc = await peer.get_service(f"{ws}/prov:pub")
    assert await svc.add(2, 3) == 5  # async function
    assert await svc.mul(4, 5) == 20  # sync function
    assert await (await peer.get_service("prot")).f() == 1
    ids = {s["id"] for s in await peer.list_services()}
    assert {f"{ws}/prov:pub", f"{ws}/prov:prot", f"{ws}/prov:built-in"} <= ids
    info = await peer.get_service_info("pub")
    assert info["config"]["visibility"] == "public"
    assert "add" in info["service_schema"]


async def test_service_not_found_is_a_clear_error(connect):
    api = await connect()
    with pytest.raises(RemoteException, match="Service not found"):
        await api.get_service("nope")


# 3. calls and values ----------------------------------------------------------


async def test_positional_keyword_and_every_msgpack_type_round_trip(connect):
    provider = await connect(client_id="prov")
    await provider.register_service(
        {
            "id": "echo",
            "config": {"visibility": "public"},
            "echo": lambda x: x,
            "mix": lambda a, b, c=3, **kw: [a, b, c, kw],
        }
    )
    caller = await connect(client_id="caller")
    svc = await caller.get_service(f"{provider.config['workspace']}/prov:echo")
    values = [
        None,
        True,
        0,
        -1,
        2**40,
        1.5,
        "text",
        "ünïcode",
        b"\x00\xff",
        [1, [2, [3]]],
        {"a": {"b": [1, 2, {"c": None}]}},
        [],
    ]
    for value in values:
        assert await svc.echo(value) == value
    assert await svc.mix(1, 2) == [1, 2, 3, {}]
    assert await svc.mix(1, b=2, c=4, d="z") == [1, 2, 4, {"d": "z"}]


async def test_ten_mebibyte_payloads_each_way(connect):
    provider = await connect(client_id="prov")
    big_back = bytes(range(256)) * (10 * 1024 * 4)  # 10 MiB
    await provider.register_service(
        {"id": "big", "config": {"visibility": "public"}, "size": lambda data: len(data), "give": lambda: big_back}
    )
    caller = await connect(client_id="caller")
    svc = await caller.get_service(f"{provider.config['workspace']}/prov:big")
    assert await svc.size(b"\x01" * (10 * 1024 * 1024)) == 10 * 1024 * 1024
    assert await svc.give() == big_back


async def test_an_exception_in_the_service_reaches_the_caller_with_its_message(connect):
    provider = await connect(client_id="prov")

    def fail():
        raise ValueError("the widget is broken")

    await provider.register_service({"id": "bad", "config": {"visibility": "public"}, "fail": fail})
    caller = await connect(client_id="caller")
    svc = await caller.get_service(f"{provider.config['workspace']}/prov:bad")
    with pytest.raises(RemoteException, match="the widget is broken"):
        await svc.fail()


async def test_calling_a_service_whose_client_left_fails_fast(connect):
    provider = await connect(client_id="prov")
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: 1})
    caller = await connect(client_id="caller", method_timeout=30)
    svc = await caller.get_service(f"{provider.config['workspace']}/prov:s")
    await provider.disconnect()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Exception, match="not connected"):
        await svc.f()
    assert loop.time() - started < 2, "must fail fast, not wait for the 30 s call timeout"


# 4. callbacks and generators ------------------------------------------------


async def test_callbacks_are_called_back_several_times(connect):
    provider = await connect(client_id="prov")

    async def run(callback, n):
        return [await callback(i) for i in range(n)]

    await provider.register_service({"id": "cb", "config": {"visibility": "public"}, "run": run})
    caller = await connect(client_id="caller")
    svc = await caller.get_service(f"{provider.config['workspace']}/prov:cb")
    assert await svc.run(lambda v: v * 10, 4) == [0, 10, 20, 30]


async def test_async_generators_stream_to_the_caller(connect):
    provider = await connect(client_id="prov")

    async def count(n):
        for i in range(n):
            yield i

    await provider.register_service({"id": "gen", "config": {"visibility": "public"}, "count": count})
    caller = await connect(client_id="caller")
    svc = await caller.get_service(f"{provider.config['workspace']}/prov:gen")
    got = [item async for item in await svc.count(5)]
    assert got == [0, 1, 2, 3, 4]


# 5. tokens and permissions --------------------------------------------------


async def test_without_a_token_a_client_cannot_register_in_or_call_protected_of_a_workspace(connect):
    owner = await connect(client_id="owner")
    ws = owner.config["workspace"]
    await owner.register_service({"id": "prot", "f": lambda: "secret"})
    await owner.register_service({"id": "pub", "config": {"visibility": "public"}, "f": lambda: "hi"})
    stranger = await connect(client_id="stranger")
    with pytest.raises(RemoteException, match="Permission denied"):
        await stranger.get_service(f"{ws}/owner:prot")
    assert await (await stranger.get_service(f"{ws}/owner:pub")).f() == "hi"
    with pytest.raises(ConnectionAbortedError, match="Permission denied|does not exist"):
        await connect(client_id="intruder", workspace=ws)


async def test_a_read_only_token_can_call_but_not_register(connect):
    owner = await connect(client_id="owner")
    await owner.register_service({"id": "s", "f": lambda: 1})
    token = await owner.generate_token({"permission": "read"})
    reader = await connect(client_id="reader", token=token)
    assert await (await reader.get_service("owner:s")).f() == 1
    # the client wraps the manager's refusal: "Failed to notify workspace manager: ..."
    with pytest.raises(Exception, match="Permission denied"):
        await reader.register_service({"id": "mine", "f": lambda: 2})


async def test_generating_a_token_for_someone_elses_workspace_is_refused(connect):
    api = await connect()
    with pytest.raises(RemoteException, match="Only admin"):
        await api.generate_token({"workspace": "ws-user-someone-else"})


async def test_a_token_for_one_workspace_cannot_join_another(connect):
    owner = await connect(client_id="owner")
    token = await owner.generate_token()
    with pytest.raises(ConnectionAbortedError, match="does not match"):
        await connect(client_id="x", token=token, workspace="ws-user-elsewhere")


# 6. events ----------------------------------------------------------------------


async def test_emitted_events_reach_subscribers_only(connect):
    alice = await connect(client_id="alice")
    token = await alice.generate_token()
    bob = await connect(client_id="bob", token=token)
    carol = await connect(client_id="carol", token=token)
    got_bob: list = []
    got_carol: list = []
    bob.on("my-event", got_bob.append)
    carol.on("my-event", got_carol.append)
    assert await bob.subscribe(["my-event"]) is True
    await alice.emit({"type": "my-event", "to": "*", "data": {"n": 1}})
    await eventually(lambda: got_bob, what="bob's event")
    ws = alice.config["workspace"]
    assert got_bob[0]["data"] == {"n": 1}
    assert got_bob[0]["from"] == f"{ws}/alice"
    assert got_bob[0]["to"] == f"{ws}/*"
    # carol did not subscribe: a ping round trip later she still has nothing
    assert await carol.ping("alice") == "pong"
    assert got_carol == []


async def test_server_events_on_connect_service_changes_and_disconnect(connect):
    watcher = await connect(client_id="watcher")
    ws = watcher.config["workspace"]
    events: list = []
    for name in ("client_connected", "service_added", "service_removed", "client_disconnected"):
        watcher.on(name, events.append)
    await watcher.subscribe(["client_connected", "service_added", "service_removed", "client_disconnected"])
    token = await watcher.generate_token()
    other = await connect(client_id="other", token=token)
    await other.register_service({"id": "svc", "f": lambda: 1})
    await other.unregister_service("svc")
    await other.disconnect()
    await eventually(lambda: any(e["type"] == "client_disconnected" for e in events), what="disconnect event")
    kinds = [(e["type"], e["data"].get("id")) for e in events]
    assert ("client_connected", f"{ws}/other") in kinds
    assert ("service_added", f"{ws}/other:svc") in kinds
    assert ("service_removed", f"{ws}/other:svc") in kinds
    assert ("client_disconnected", "other") in kinds
    assert kinds.index(("client_connected", f"{ws}/other")) < kinds.index(("service_added", f"{ws}/other:svc"))


# 7. withdrawal -------------------------------------------------------------------


async def test_unregister_and_disconnect_remove_services_from_listings_at_once(connect):
    owner = await connect(client_id="owner")
    token = await owner.generate_token()
    other = await connect(client_id="other", token=token)
    await other.register_service({"id": "a", "f": lambda: 1})
    await other.register_service({"id": "b", "f": lambda: 2})
    ws = owner.config["workspace"]
    ids = {s["id"] for s in await owner.list_services()}
    assert {f"{ws}/other:a", f"{ws}/other:b"} <= ids
    await other.unregister_service("a")
    ids = {s["id"] for s in await owner.list_services()}
    assert f"{ws}/other:a" not in ids
    assert f"{ws}/other:b" in ids
    with pytest.raises(RemoteException, match="Service not found"):
        await owner.get_service("other:a")
    await other.disconnect()

    # the server learns of the close one network hop later
    async def listed_ids() -> list[set[str]]:
        ids = {s["id"] for s in await owner.list_services()}
        return [] if f"{ws}/other:b" in ids else [ids]

    (ids,) = await eventually(listed_ids, "other:b withdrawn", timeout=2)
    assert not any(i.startswith(f"{ws}/other:") for i in ids)
    assert f"{ws}/other" not in {c["id"] for c in await owner.list_clients()}


# 8. reconnection --------------------------------------------------------------------


async def test_a_client_that_reconnects_with_its_token_gets_its_identity_back(connect, server):
    api = await connect(client_id="phoenix")
    ws = api.config["workspace"]
    await api.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "back"})
    caller = await connect(client_id="caller")
    # cut the connection from the server side without a goodbye
    peer = server.hub.peers[f"{ws}/phoenix"]
    peer.close(1011, "test: connection dropped")
    await eventually(lambda: server.hub.peers.get(f"{ws}/phoenix") not in (None, peer), "reconnection", timeout=10)
    assert server.hub.peers[f"{ws}/phoenix"].workspace == ws
    svc = await eventually(lambda: caller.get_service(f"{ws}/phoenix:s"), "the service listed again", timeout=4)
    assert await svc.f() == "back"


async def test_a_second_live_client_with_the_same_id_is_refused(connect):
    owner = await connect(client_id="owner")
    ws = owner.config["workspace"]
    token = await owner.generate_token()
    await connect(client_id="twin", token=token)
    with pytest.raises(ConnectionAbortedError, match="already exists and is active"):
        await connect(client_id="twin", token=token, workspace=ws)
    # another user may not have the id at all, live or not (tests/security/test_client_id_ownership.py)
    with pytest.raises(ConnectionAbortedError, match="already exists and is active: .* belongs to another user"):
        await connect(client_id="twin", token=await owner.generate_token(), workspace=ws)


async def test_a_service_whose_methods_shadow_dict_methods_is_served(connect):
    provider = await connect(client_id="prov")
    await provider.register_service(
        {
            "id": "dict-like",
            "config": {"visibility": "public"},
            "get": lambda key: f"got {key}",
            "keys": lambda: ["k"],
            "items": lambda: [],
            "pop": lambda: 1,
        }
    )
    svc = await provider.get_service("dict-like")
    assert await svc.get("x") == "got x"
    assert svc.config.workspace == provider.config["workspace"]


# 9. a provider that dies ---------------------------------------------------------

PROVIDER = """
import asyncio, sys
from hypha_rpc import connect_to_server

async def main():
    api = await connect_to_server({"server_url": sys.argv[1], "token": sys.argv[2], "client_id": "doomed"})
    await api.register_service({"id": "doomed-svc", "f": lambda: 1})
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.parametrize("settings", [settings_for_tests(transit_grace=1.0)])
async def test_the_service_of_a_provider_killed_mid_session_is_not_found_once_its_grace_is_over(connect, server):
    """hypha-rpc's own suite (test_launch_external_services) kills a provider's process and
    expects ``get_service`` to say "not found". Its dropped connection first makes it a client
    in transit, still listed; a lookup meanwhile waits for it, and once the grace is over the
    caller hears that the service is gone, not that a peer is "not connected"."""
    owner = await connect(client_id="owner")
    token = await owner.generate_token()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROVIDER, server.url, token, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert (await asyncio.wait_for(proc.stdout.readline(), 20)).strip() == b"ready"
        assert await (await owner.get_service("doomed-svc")).f() == 1
    finally:
        proc.kill()
        await proc.wait()
    started = time.monotonic()
    with pytest.raises(RemoteException, match="not found"):
        await owner.get_service("doomed-svc")
    assert time.monotonic() - started < 1.0 + 5.0, "the lookup waited for the grace, not for its timeout"
