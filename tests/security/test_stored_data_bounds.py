"""Every stored thing is charged to a principal, bounded, and has a lifetime (issue 37, item 3). The attackers:
anonymous identities (free to make) that write the most a workspace may hold, then leave; a bookmark of a service
with a large info; an account's generated identity writing in its own personal workspace; a crowd of accounts
writing until the hub-wide ceiling."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypha_rpc import connect_to_server
from hypha_rpc.rpc import RemoteException

from support.tokens import credential
from switchboard.hub.manager import event_log, workspace_data, workspace_records
from switchboard.testing import ValkeyServer
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

KIB = 1024


@pytest.fixture
def small_maxima(monkeypatch: pytest.MonkeyPatch) -> None:
    """A workspace's maxima made small, so that writing all of them is quick (the rule is the same)."""
    monkeypatch.setattr(workspace_data, "MAX_ENV_ENTRIES", 4)
    monkeypatch.setattr(workspace_data, "MAX_SERVICE_TYPES", 2)
    monkeypatch.setattr(event_log, "MAX_LOG_ENTRIES", 6)
    monkeypatch.setattr(workspace_records, "MAX_BOOKMARKS", 2)


# What one value may weigh in an anonymous workspace: a sixteenth of another's (docs/authorization.md)
ANONYMOUS_ENV, ANONYMOUS_TYPE, ANONYMOUS_EVENT = 1 * KIB, 4 * KIB, 1 * KIB


async def _write_anonymous_maxima(client: Any) -> None:
    """Every env value, service type, log entry and bookmark an anonymous workspace may hold, each near its
    largest: more is refused."""
    with pytest.raises(RemoteException, match=f"value too large: at most {ANONYMOUS_ENV} bytes"):
        await client.set_env("K", "v" * ANONYMOUS_ENV)
    for i in range(workspace_data.MAX_ENV_ENTRIES):
        await client.set_env(f"K{i}", "v" * (ANONYMOUS_ENV - 16))
    with pytest.raises(RemoteException, match="Too many environment variables"):
        await client.set_env("one-more", "v")
    with pytest.raises(RemoteException, match=f"type_info too large: at most {ANONYMOUS_TYPE} bytes"):
        await client.register_service_type({"id": "big", "name": "t", "definition": {"doc": "d" * ANONYMOUS_TYPE}})
    for i in range(workspace_data.MAX_SERVICE_TYPES):
        definition = {"doc": "d" * (ANONYMOUS_TYPE - 256)}
        await client.register_service_type({"id": f"type-{i}", "name": "t", "definition": definition})
    with pytest.raises(RemoteException, match=f"event data too large: at most {ANONYMOUS_EVENT} bytes"):
        await client.log_event("note", "n" * ANONYMOUS_EVENT)
    for _ in range(event_log.MAX_LOG_ENTRIES + 2):
        await client.log_event("note", "n" * (ANONYMOUS_EVENT - 16))
    for i in range(workspace_records.MAX_BOOKMARKS):
        await client.register_service({"id": f"svc-{i}", "config": {"visibility": "public"}, "f": lambda: 1})
        await client.bookmark({"bookmark_type": "service", "id": f"svc-{i}"})


async def _holds_nothing(server: RunningServer, workspace: str) -> bool:
    store = server.hub.http.workspaces
    tables = [await store.table(workspace, t) for t in ("env", "types", "bookmarks")]
    return not any(tables) and not await store.log_entries(workspace, 10_000)


async def test_anonymous_identities_writing_their_little_maxima_leave_nothing_behind(
    server: RunningServer, small_maxima
):
    for n in range(2):  # each new identity is free: what one leaves, every one leaves
        client = await connect_to_server({"server_url": server.url, "client_id": f"anon-{n}"})
        workspace = client.config["workspace"]
        try:
            await _write_anonymous_maxima(client)
            assert await client.get_env("K0")  # kept while its session lasts
        finally:
            await client.disconnect()
        await eventually(lambda w=workspace: _holds_nothing(server, w), f"{workspace}'s data freed when it left")


async def test_an_anonymous_workspaces_data_lasts_while_any_of_its_clients_is_connected(server: RunningServer):
    first = await connect_to_server({"server_url": server.url, "client_id": "anon-a"})
    workspace = first.config["workspace"]
    helper_token = await first.generate_token({"permission": "read_write"})
    second = await connect_to_server({"server_url": server.url, "client_id": "anon-b", "token": helper_token})
    try:
        await first.set_env("KEY", "value")
        await first.disconnect()
        assert await second.get_env("KEY") == "value"  # another client of the workspace is still there
    finally:
        await second.disconnect()
    await eventually(lambda: _holds_nothing(server, workspace), f"{workspace}'s data freed when the last one left")


async def test_a_bookmark_refers_to_a_service_by_id_and_does_not_copy_its_info(server: RunningServer) -> None:
    alice = await connect_to_server(
        {"server_url": server.url, "client_id": "alice", "token": credential("alice", 600)[0]}
    )
    try:
        big = {"visibility": "public", "blob": "x" * (512 * KIB)}
        await alice.register_service({"id": "big", "description": "d" * (64 * KIB), "config": big, "f": lambda: 1})
        await alice.bookmark({"bookmark_type": "service", "id": "big"})
        [mark] = [m for m in (await alice.get_workspace_info())["config"]["bookmarks"] if m["id"].endswith(":big")]
        assert mark == {"bookmark_type": "service", "id": mark["id"]}
        stored = await server.hub.http.workspaces.table(alice.config["workspace"], "bookmarks")
        assert sum(len(v) for v in stored.values()) < KIB, "a bookmark copied its service's info"
    finally:
        await alice.disconnect()


async def test_a_generated_identity_keeps_no_data_in_its_own_personal_workspace(server: RunningServer) -> None:
    """Every token minted is a new user id with a personal workspace of its own (bookmarks go there, and it may
    mint tokens for it): data kept there would be charged to nobody, and one account could mint without end."""
    bob = await connect_to_server({"server_url": server.url, "client_id": "bob", "token": credential("bob", 600)[0]})
    try:
        await bob.register_service({"id": "calc", "config": {"visibility": "public"}, "f": lambda: 1})
        child = await connect_to_server(
            {"server_url": server.url, "client_id": "guest", "token": await bob.generate_token({"permission": "read"})}
        )
        try:
            with pytest.raises(RemoteException, match="keeps no data"):
                await child.bookmark({"bookmark_type": "service", "id": "bob:calc"})
            own = f"ws-user-{child.config['user']['id']}"
            sandbox = await child.generate_token({"workspace": own, "permission": "admin"})
        finally:
            await child.disconnect()
        grandchild = await connect_to_server(
            {"server_url": server.url, "client_id": "sandboxed", "token": sandbox, "workspace": own}
        )
        try:
            for call in (
                lambda: grandchild.set_env("K", "v" * 1000),
                lambda: grandchild.set_env("K", None),  # a removal writes the event log
                lambda: grandchild.log_event("note", "n" * 1000),
                lambda: grandchild.register_service_type({"id": "t", "name": "t", "definition": {}}),
            ):
                with pytest.raises(RemoteException, match="keeps no data"):
                    await call()
        finally:
            await grandchild.disconnect()
        assert await _holds_nothing(server, own)
        await bob.set_env("K", "v")  # the account's own personal workspace keeps it
        await bob.bookmark({"bookmark_type": "service", "id": "bob:calc"})
    finally:
        await bob.disconnect()


CEILING = 1024 * KIB


@pytest.fixture
async def capped_hub(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A hub keeping at most :data:`CEILING` bytes of workspace data: embedded, or a replica on Valkey."""
    if request.param == "embedded":
        async with running(settings_for_tests(max_workspace_data_bytes=CEILING)) as hub:
            yield hub.url
        return
    with ValkeyServer() as valkey:
        env = {"SWITCHBOARD_MAX_WORKSPACE_DATA_BYTES": str(CEILING)}
        replica = ReplicaProcess(replica_id="capped", redis_url=valkey.url, env=env)
        try:
            replica.start()
            yield replica.url
        finally:
            replica.kill()


@pytest.mark.parametrize("capped_hub", ["embedded", "redis"], indirect=True)
async def test_the_hub_wide_ceiling_answers_a_clear_error(capped_hub: str) -> None:
    refusal = None
    for n in range(8):  # accounts cost the attacker little: each writes its workspace's env maximum
        user = await connect_to_server(
            {"server_url": capped_hub, "client_id": f"crowd-{n}", "token": credential(f"crowd-{n}", 600)[0]}
        )
        try:
            for i in range(workspace_data.MAX_ENV_ENTRIES):
                await user.set_env(f"K{i}", "v" * (workspace_data.MAX_ENV_VALUE_BYTES - 16))
        except RemoteException as exc:
            refusal = str(exc)
        finally:
            await user.disconnect()
        if refusal is not None:
            break
    assert refusal is not None, "no ceiling: the crowd wrote 8 workspaces' worth"
    assert "The hub's workspace data is full" in refusal
    late = await connect_to_server({"server_url": capped_hub, "client_id": "late", "token": credential("late", 600)[0]})
    try:
        assert await late.get_env() == {}  # the hub still answers
    finally:
        await late.disconnect()


async def test_an_account_creating_and_deleting_workspaces_in_a_loop_is_stopped_at_its_bound() -> None:
    """Each deletion leaves a mark kept a year (no token of the old workspace may enter a new one of that name):
    a create/delete loop grew them without bound; they are charged to the account, through its generated tokens."""
    async with running(settings_for_tests(max_deletions_per_user=3)) as hub:
        carol = await connect_to_server(
            {"server_url": hub.url, "client_id": "carol", "token": credential("carol", 600)[0]}
        )
        child = await connect_to_server(
            {"server_url": hub.url, "client_id": "carols-child", "token": await carol.generate_token({})}
        )
        refusal, maker, n = None, carol, 0
        try:
            for n in range(6):  # bounded: the third deletion is the last one kept
                maker = (carol, child)[n % 2]  # a generated identity is charged to the account that made it
                await maker.create_workspace({"id": f"loop-{n}"})
                try:
                    await maker.delete_workspace(f"loop-{n}")
                except RemoteException as exc:
                    refusal = str(exc)
                    break
            assert refusal is not None
            assert "Too many workspaces deleted by carol: at most 3" in refusal
            assert await maker.get_workspace_info(f"loop-{n}"), "a refused deletion deletes nothing"
        finally:
            await child.disconnect()
            await carol.disconnect()
