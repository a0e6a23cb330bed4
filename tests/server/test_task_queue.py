"""``public/queue``, Hypha's task queue service (issue 38, item 5), on the embedded hub with real hypha-rpc
clients: Hypha's own flow works; the queues are the caller's workspace's alone; a reader may look but not take;
every push is bounded (per workspace, per principal with anonymous users as one, in size) and refused whole; a
waiting pop ends with a task or at its timeout, never hangs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server

from switchboard.backends.queues import MemoryQueues, QueueBounds
from switchboard.errors import LimitExceeded
from switchboard.hub.manager import task_queue
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

PER_WORKSPACE, PER_USER, ITEM_BYTES = 4, 6, 1024  # an anonymous workspace's item: 1024 / 16 = 64 bytes


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    settings = settings_for_tests(
        max_queue_items_per_workspace=PER_WORKSPACE, max_queue_items_per_user=PER_USER, max_queue_item_bytes=ITEM_BYTES
    )
    async with running(settings) as srv:
        yield srv


@pytest.fixture
async def connect(server: RunningServer) -> AsyncIterator[Any]:
    made: list[Any] = []

    async def _connect(**config: Any) -> Any:
        client = await connect_to_server({"server_url": server.url, "method_timeout": 20, **config})
        made.append(client)
        return client

    yield _connect
    for client in reversed(made):
        await client.disconnect()


async def test_hyphas_queue_flow_works_and_a_member_with_a_generated_token_shares_the_queues(connect: Any) -> None:
    api = await connect()
    api2 = await connect(workspace=api.config["workspace"], token=await api.generate_token())
    q = await api.get_service("public/queue")
    await q.push("test", {"hello": "world"})
    assert (await q.pop("test"))["hello"] == "world"
    await q.push("test", {"n": 1})
    assert await q.peek("test") == [{"n": 1}]
    assert await q.get_length("test") == 1
    await q.push("test", {"n": 2})
    await q.push("test", {"n": 3})
    assert await q.get_length("test") == 3
    q2 = await api2.get_service("public/queue")
    assert await q2.peek("test", 2) == [{"n": 1}, {"n": 2}], "oldest first, left in the queue"
    assert [await q2.pop("test") for _ in range(3)] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert await q2.pop("test", 0) is None
    assert [s["id"] for s in await api.list_services({"workspace": "public"}) if s["id"].endswith(":queue")]
    info = await api.get_service_info("public/queue")
    assert info["id"].startswith("public/")
    assert info["id"].endswith(":queue")
    assert info["config"]["visibility"] == "public"


async def test_an_outsider_reaches_only_its_own_workspaces_queues(connect: Any) -> None:
    owner = await connect()
    q = await owner.get_service("public/queue")
    await q.push("jobs", {"secret": 1})
    outsider = await connect()
    theirs = await outsider.get_service("public/queue")
    assert await theirs.get_length("jobs") == 0
    assert await theirs.peek("jobs", 5) == []
    assert await theirs.pop("jobs", 0) is None, "the outsider's pop took the owner's task"
    assert await q.get_length("jobs") == 1


async def test_a_reader_may_look_at_the_queues_but_neither_push_nor_pop(connect: Any) -> None:
    owner = await connect()
    ws = owner.config["workspace"]
    await (await owner.get_service("public/queue")).push("jobs", {"n": 1})
    reader = await connect(workspace=ws, token=await owner.generate_token({"permission": "read"}))
    q = await reader.get_service("public/queue")
    assert await q.get_length("jobs") == 1
    assert await q.peek("jobs") == [{"n": 1}]
    with pytest.raises(Exception, match="Permission denied"):  # noqa: PT011 - hypha-rpc's error type
        await q.push("jobs", {"n": 2})
    with pytest.raises(Exception, match="Permission denied"):  # noqa: PT011
        await q.pop("jobs", 0)
    assert await q.get_length("jobs") == 1


async def test_a_push_past_the_workspaces_bound_is_refused_and_stores_nothing(connect: Any) -> None:
    q = await (await connect()).get_service("public/queue")
    for i in range(PER_WORKSPACE):
        await q.push(f"q{i % 2}", {"n": i})  # the bound counts every queue of the workspace
    with pytest.raises(Exception, match="Queue full"):  # noqa: PT011
        await q.push("q0", {"n": "one more"})
    assert await q.get_length("q0") + await q.get_length("q1") == PER_WORKSPACE
    await q.pop("q1", 0)
    await q.push("q1", {"n": "after a pop"})


async def test_anonymous_users_together_hold_one_users_allowance(connect: Any) -> None:
    first = await (await connect()).get_service("public/queue")
    second = await (await connect()).get_service("public/queue")
    for i in range(PER_WORKSPACE):
        await first.push("q", {"n": i})
    for i in range(PER_USER - PER_WORKSPACE):
        await second.push("q", {"n": i})
    with pytest.raises(Exception, match="Too many queued tasks for anonymous users"):  # noqa: PT011
        await second.push("q", {"n": "one more"})


async def test_a_task_too_large_or_not_an_object_is_refused_with_a_clear_error(connect: Any) -> None:
    q = await (await connect()).get_service("public/queue")
    with pytest.raises(Exception, match="Task too large"):  # noqa: PT011
        await q.push("q", {"blob": "x" * (ITEM_BYTES // 16)})
    with pytest.raises(Exception, match="task must be an object"):  # noqa: PT011
        await q.push("q", ["not", "a", "dict"])
    with pytest.raises(Exception, match="Invalid queue name"):  # noqa: PT011
        await q.push("../other", {"n": 1})
    with pytest.raises(Exception, match="timeout must be"):  # noqa: PT011
        await q.pop("q", 301)
    with pytest.raises(Exception, match="n must be"):  # noqa: PT011
        await q.peek("q", 0)
    assert await q.get_length("q") == 0


async def test_a_waiting_pop_gets_a_task_pushed_meanwhile_and_an_empty_one_ends_at_its_timeout(connect: Any) -> None:
    api = await connect()
    worker = await (await connect(workspace=api.config["workspace"], token=await api.generate_token())).get_service(
        "public/queue"
    )
    q = await api.get_service("public/queue")
    waiting = asyncio.ensure_future(worker.pop("jobs", 10))
    await q.push("jobs", {"job": 7})
    assert await asyncio.wait_for(waiting, 5) == {"job": 7}
    started = time.monotonic()
    assert await worker.pop("jobs", 0.5) is None
    assert time.monotonic() - started < 3, "an empty pop ends at its timeout"


async def test_queued_items_expire_and_free_their_charges() -> None:
    clock = FakeClock()
    store = MemoryQueues(clock, QueueBounds(per_workspace=2, per_principal=2, total=3))
    await store.push("w", "q", "{}", principal="p", until=clock.time() + 10)
    await store.push("w", "q", "{}", principal="p", until=clock.time() + 20)
    with pytest.raises(LimitExceeded, match="Queue full"):
        await store.push("w", "q", "{}", principal="p", until=clock.time() + 20)
    clock.advance(15)
    assert await store.length("w", "q") == 1
    assert store.held_by("p") == 1
    await store.push("w", "q", "{}", principal="p", until=clock.time() + 10)
    clock.advance(60)
    assert await store.pop("w", "q") is None
    assert store.held_by("p") == 0
    assert len(store) == 0


async def test_over_http_the_queues_are_the_tokens_workspaces_and_an_anonymous_request_pushes_nothing(
    server: RunningServer, connect: Any
) -> None:
    api = await connect()
    token = await api.generate_token()
    base = f"{server.url}/public/services/queue"
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=10) as http:
        pushed = await http.post(f"{base}/push", json={"queue_name": "jobs", "task": {"n": 1}}, headers=auth)
        assert pushed.status_code == 200, pushed.text
        assert (await http.get(f"{base}/get_length", params={"queue_name": "jobs"}, headers=auth)).json() == 1
        info = await http.get(base, headers=auth)
        assert info.json()["id"].endswith(":queue")
        refused = await http.post(f"{base}/push", json={"queue_name": "jobs", "task": {"n": 2}})
        assert refused.status_code == 403, refused.text
    assert await (await api.get_service("public/queue")).pop("jobs", 0) == {"n": 1}


async def test_one_client_holds_a_few_waiting_pops_and_one_more_is_refused_at_once(
    server: RunningServer, connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task_queue, "MAX_WAITING_POPS_PER_CLIENT", 3)  # fewer than a workspace's tasks here
    api = await connect()
    q = await api.get_service("public/queue")
    waiting = [asyncio.ensure_future(q.pop("jobs", 10)) for _ in range(task_queue.MAX_WAITING_POPS_PER_CLIENT)]
    other = await (await connect(workspace=api.config["workspace"], token=await api.generate_token())).get_service(
        "public/queue"
    )
    queue = server.hub.manager.queue
    await eventually(lambda: queue.waiting == task_queue.MAX_WAITING_POPS_PER_CLIENT, "every pop of the client waiting")
    started = time.monotonic()
    with pytest.raises(Exception, match="Too many pops waiting for this client"):  # noqa: PT011
        await q.pop("jobs", 10)
    assert time.monotonic() - started < 3, "refused at once, not after waiting"
    assert await other.pop("jobs", 0.3) is None, "another client still waits"
    for n in range(task_queue.MAX_WAITING_POPS_PER_CLIENT):
        await other.push("jobs", {"n": n})
    assert sorted(t["n"] for t in await asyncio.wait_for(asyncio.gather(*waiting), 10)) == list(
        range(task_queue.MAX_WAITING_POPS_PER_CLIENT)
    )
