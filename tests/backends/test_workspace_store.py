"""What every ``WorkspaceStore`` must do, run against the memory store and a real Valkey."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from switchboard.backends.base import WorkspaceStore
from switchboard.backends.memory_workspaces import MemoryWorkspaceStore
from switchboard.backends.redis.shared.connection import make_client
from switchboard.backends.redis.stores.workspaces import RedisWorkspaceStore
from switchboard.errors import LimitExceeded
from switchboard.testing import FakeClock, ValkeyServer
from switchboard.testing.wait import eventually

TTL = 0.5  # short, so expiry on a real Valkey is seen within a test


@pytest.fixture(scope="module")
def valkey_workspaces() -> Iterator[ValkeyServer]:
    with ValkeyServer() as server:
        yield server


CLOCKS: dict[int, FakeClock] = {}  # the memory store's clock, by store, for the test that moves time


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[WorkspaceStore]:
    if request.param == "memory":
        clock = FakeClock()
        memory = MemoryWorkspaceStore(ttl=TTL, clock=clock)
        CLOCKS[id(memory)] = clock
        yield memory
        CLOCKS.pop(id(memory))
        return
    server = request.getfixturevalue("valkey_workspaces")
    server.client().flushall()  # a fresh, empty store per test (test-owned server)
    client = make_client(server.url)
    try:
        yield RedisWorkspaceStore(client, ttl=TTL)
    finally:
        await client.aclose()


def record(ws: str, *, persistent: bool = False, owners: tuple[str, ...] = ("alice",)) -> dict[str, object]:
    return {"id": ws, "name": ws, "owners": list(owners), "persistent": persistent}


async def test_a_record_is_created_once_unless_overwritten(store: WorkspaceStore) -> None:
    assert await store.put(record("team-a"), overwrite=False)
    assert not await store.put(record("team-a", owners=("mallory",)), overwrite=False)
    assert (await store.get("team-a"))["owners"] == ["alice"]  # type: ignore[index]
    assert await store.put(record("team-a", owners=("bob",)), overwrite=True)
    assert (await store.get("team-a"))["owners"] == ["bob"]  # type: ignore[index]
    assert [r["id"] for r in await store.records(10)] == ["team-a"]


async def test_removing_a_workspace_removes_its_record_tables_and_log(store: WorkspaceStore) -> None:
    await store.put(record("team-a", persistent=True), overwrite=False)
    assert await store.table_set("team-a", "env", "k", '"v"', max_entries=5, keep=True, only_new=False)
    await store.log_append("team-a", "e1", max_entries=10, keep=True)
    removed = await store.remove("team-a")
    assert removed is not None
    assert removed["id"] == "team-a"
    assert await store.get("team-a") is None
    assert await store.table("team-a", "env") == {}
    assert await store.log_entries("team-a", 10) == []
    assert await store.remove("team-a") is None


async def test_a_table_is_bounded_and_only_new_refuses_an_existing_key(store: WorkspaceStore) -> None:
    for i in range(3):
        assert await store.table_set("ws-x", "env", f"k{i}", str(i), max_entries=3, keep=False, only_new=False)
    assert not await store.table_set("ws-x", "env", "k3", "3", max_entries=3, keep=False, only_new=False)
    assert await store.table_set("ws-x", "env", "k0", "new", max_entries=3, keep=False, only_new=False)  # a change
    assert not await store.table_set("ws-x", "env", "k0", "again", max_entries=3, keep=False, only_new=True)
    assert await store.table_set("ws-x", "env", "k1", None, max_entries=3, keep=False, only_new=False)
    assert await store.table("ws-x", "env") == {"k0": "new", "k2": "2"}


async def test_the_log_keeps_about_its_last_entries_oldest_first(store: WorkspaceStore) -> None:
    for i in range(500):
        await store.log_append("ws-x", f"e{i}", max_entries=100, keep=False)
    kept = await store.log_entries("ws-x", 1000)
    # Redis trims approximately (MAXLEN ~): never below the bound, at most a node's worth above it
    assert 100 <= len(kept) <= 200
    assert kept[-1] == "e499"
    assert kept == sorted(kept, key=lambda e: int(e[1:]))
    assert await store.log_entries("ws-x", 3) == ["e497", "e498", "e499"]


async def test_data_without_a_persistent_record_expires_after_its_last_write(store: WorkspaceStore) -> None:
    await store.put(record("kept-ws", persistent=True), overwrite=False)
    for ws, keep in (("brief-ws", False), ("kept-ws", True)):
        await store.table_set(ws, "env", "k", "v", max_entries=5, keep=keep, only_new=False)
        await store.log_append(ws, "e", max_entries=5, keep=keep)
    if id(store) in CLOCKS:
        CLOCKS[id(store)].advance(TTL + 0.1)
    else:
        await eventually(lambda: _gone(store, "brief-ws"), "brief-ws's data expired", timeout=TTL * 20, interval=0.1)
    assert await store.table("brief-ws", "env") == {}
    assert await store.table("kept-ws", "env") == {"k": "v"}
    assert await store.log_entries("kept-ws", 5) == ["e"]


async def test_a_deletion_is_remembered_until_its_ttl_ends_and_removing_keeps_it(
    store: WorkspaceStore,
) -> None:
    await store.put(record("team-a"), overwrite=False)
    assert await store.deleted_at("team-a") is None
    await store.remove("team-a")
    await store.mark_deleted("team-a", 1234.5, ttl=3600, principal="alice")
    await store.mark_deleted("team-b", 99.0, ttl=TTL, principal="alice")
    assert await store.deleted_at("team-a") == 1234.5
    await store.remove("team-a")  # removing what is left of it does not forget that it was deleted
    assert await store.deleted_at("team-a") == 1234.5
    if id(store) in CLOCKS:
        CLOCKS[id(store)].advance(TTL + 0.1)
    else:
        await eventually(
            lambda: _not_deleted(store, "team-b"), "team-b's tombstone expired", timeout=TTL * 20, interval=0.1
        )
    assert await store.deleted_at("team-b") is None


async def _not_deleted(store: WorkspaceStore, ws: str) -> bool:
    return await store.deleted_at(ws) is None


async def _gone(store: WorkspaceStore, ws: str) -> bool:
    return await store.table(ws, "env") == {} and await store.log_entries(ws, 5) == []


def test_the_memory_store_keeps_persistent_records_in_its_file_and_only_those(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "workspaces.json"

    async def first_life() -> None:
        store = MemoryWorkspaceStore(ttl=TTL, path=path)
        await store.put(record("kept-ws", persistent=True), overwrite=False)
        await store.put(record("brief-ws"), overwrite=False)
        await store.put(record("was-kept", persistent=True), overwrite=False)
        await store.put(record("was-kept"), overwrite=True)  # no longer persistent: not kept

    asyncio.run(first_life())
    assert "brief-ws" not in path.read_text()
    assert path.stat().st_mode & 0o077 == 0
    again = MemoryWorkspaceStore(ttl=TTL, path=path)
    assert asyncio.run(again.get("kept-ws")) is not None
    assert asyncio.run(again.get("brief-ws")) is None
    assert asyncio.run(again.get("was-kept")) is None


async def test_a_persistent_write_appends_one_record_and_rewrites_none(tmp_path: Path) -> None:
    path = tmp_path / "workspaces.json"
    store = MemoryWorkspaceStore(ttl=TTL, path=path)
    for i in range(50):
        await store.put(record(f"kept-{i}", persistent=True), overwrite=False)
    before, inode = path.read_bytes(), path.stat().st_ino
    await store.put(record("one-more", persistent=True), overwrite=False)
    after = path.read_bytes()
    assert path.stat().st_ino == inode, "the file was replaced, not appended to"
    assert after.startswith(before)
    assert len(after) - len(before) < 2 * len(json.dumps(record("one-more", persistent=True)))


async def test_the_log_is_compacted_to_its_live_records_and_read_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "workspaces.json"
    store = MemoryWorkspaceStore(ttl=TTL, path=path)
    for i in range(10):
        await store.put(record(f"kept-{i}", persistent=True), overwrite=False)
    for round_ in range(300):  # churn: each creates and removes one, or rewrites a kept one
        await store.put(record(f"brief-{round_}", persistent=True), overwrite=False)
        await store.remove(f"brief-{round_}")
        await store.put(record(f"kept-{round_ % 10}", persistent=True) | {"description": str(round_)}, overwrite=True)
    # 910 writes; the file holds at most twice the 10 live records plus 64 lines (record_log.COMPACT_SLACK)
    assert len(path.read_text().splitlines()) <= 2 * 10 + 64 + 1
    again = MemoryWorkspaceStore(ttl=TTL, path=path)
    kept = {r["id"]: r for r in await again.records(100)}
    assert sorted(kept) == sorted(f"kept-{i}" for i in range(10))
    assert kept["kept-9"]["description"] == "299"


async def test_a_line_cut_short_by_a_crash_is_skipped_and_the_earlier_format_is_read(tmp_path: Path) -> None:
    path = tmp_path / "workspaces.json"
    store = MemoryWorkspaceStore(ttl=TTL, path=path)
    await store.put(record("kept-ws", persistent=True), overwrite=False)
    with path.open("a") as file:
        file.write('{"put": {"id": "half')
    assert await MemoryWorkspaceStore(ttl=TTL, path=path).get("kept-ws") is not None
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps([record("old-ws", persistent=True)]))
    assert await MemoryWorkspaceStore(ttl=TTL, path=earlier).get("old-ws") is not None
    assert await MemoryWorkspaceStore(ttl=TTL, path=earlier).get("old-ws") is not None, "rewritten as a log"


# -- the hub-wide ceiling on every workspace's data together (issue 37, item 3)

CEILING = 2_000


@pytest.fixture(params=["memory", "redis"])
async def capped(request: pytest.FixtureRequest) -> AsyncIterator[tuple[WorkspaceStore, FakeClock]]:
    """A store holding at most :data:`CEILING` bytes of data in all, on a fake clock (its TTLs on Redis are real)."""
    clock = FakeClock()
    if request.param == "memory":
        yield MemoryWorkspaceStore(ttl=3600, clock=clock, max_bytes=CEILING), clock
        return
    server = request.getfixturevalue("valkey_workspaces")
    server.client().flushall()
    client = make_client(server.url)
    try:
        yield RedisWorkspaceStore(client, ttl=3600, clock=clock, max_bytes=CEILING), clock
    finally:
        await client.aclose()


async def test_a_write_past_the_hub_wide_ceiling_is_refused_and_writes_nothing(capped) -> None:
    store, _ = capped
    value = "v" * 400
    for i in range(4):  # 4 x 402 bytes, in two workspaces
        assert await store.table_set(f"ws-{i % 2}", "env", f"k{i}", value, max_entries=9, keep=False, only_new=False)
    with pytest.raises(LimitExceeded, match="The hub's workspace data is full"):
        await store.table_set("ws-2", "env", "k", value, max_entries=9, keep=False, only_new=False)
    with pytest.raises(LimitExceeded, match="The hub's workspace data is full"):
        await store.log_append("ws-2", value, max_entries=9, keep=False)
    assert await store.table("ws-2", "env") == {}
    assert await store.log_entries("ws-2", 9) == []
    assert await store.table_set("ws-0", "env", "k0", "small", max_entries=9, keep=False, only_new=False)  # shrinks


async def test_deleting_removing_trimming_and_expiring_give_the_bytes_back(capped) -> None:
    store, clock = capped
    big = "v" * 900
    await store.table_set("ws-a", "env", "k", big, max_entries=9, keep=False, only_new=False)
    await store.table_set("ws-a", "env", "k", None, max_entries=9, keep=False, only_new=False)
    await store.put(record("ws-b", persistent=True), overwrite=False)
    await store.table_set("ws-b", "types", "t", big, max_entries=9, keep=True, only_new=False)
    await store.remove("ws-b")
    for _ in range(5):  # the log keeps 1 entry: each append drops the one before
        await store.log_append("ws-c", big, max_entries=1, keep=False)
    await store.table_set("ws-d", "env", "k", big, max_entries=9, keep=False, only_new=False)
    clock.advance(3_601)  # ws-c's and ws-d's data expired
    for i in range(2):
        await store.table_set("ws-e", "env", f"k{i}", big, max_entries=9, keep=False, only_new=False)


@pytest.fixture(params=["memory", "redis"])
async def marks(request: pytest.FixtureRequest) -> AsyncIterator[tuple[WorkspaceStore, FakeClock]]:
    """A store remembering at most 2 deletions per principal and 3 in all, on a fake clock."""
    clock = FakeClock()
    bounds = {"deletions_per_principal": 2, "deletions": 3}
    if request.param == "memory":
        yield MemoryWorkspaceStore(ttl=3600, clock=clock, **bounds), clock
        return
    server = request.getfixturevalue("valkey_workspaces")
    server.client().flushall()
    client = make_client(server.url)
    try:
        yield RedisWorkspaceStore(client, ttl=3600, clock=clock, **bounds), clock
    finally:
        await client.aclose()


async def test_deletion_marks_are_bounded_per_principal_and_in_all_and_lapse_when_they_expire(marks) -> None:
    store, clock = marks
    await store.mark_deleted("team-1", 1.0, ttl=60, principal="mallory")
    await store.mark_deleted("team-2", 2.0, ttl=600, principal="mallory")
    with pytest.raises(LimitExceeded, match="Too many workspaces deleted by mallory: at most 2"):
        await store.mark_deleted("team-3", 3.0, ttl=600, principal="mallory")
    assert await store.deleted_at("team-3") is None, "a refused deletion must record nothing"
    await store.mark_deleted("team-1", 4.0, ttl=600, principal="mallory")  # deleted again: no new charge
    assert await store.deleted_at("team-1") == 4.0
    await store.mark_deleted("lab-1", 5.0, ttl=600, principal="alice")
    with pytest.raises(LimitExceeded, match="The hub remembers its maximum of 3 deleted workspaces"):
        await store.mark_deleted("lab-2", 6.0, ttl=600, principal="bob")
    clock.advance(601)  # every mark expired: their places are free
    await store.mark_deleted("team-3", 7.0, ttl=600, principal="mallory")
    await store.mark_deleted("team-4", 8.0, ttl=600, principal="mallory")
