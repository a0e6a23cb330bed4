"""A client's request waits for a silent Redis only briefly; the replica's own work waits as before.

The rules of :class:`~switchboard.backends.redis.shared.answers.Answers` are driven
synchronously; the client that carries them out runs against a real Valkey
behind a fault proxy that blackholes it (bytes and FINs dropped, sockets open).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from switchboard.backends.patience import patience
from switchboard.backends.redis import RedisRegistry, make_client
from switchboard.backends.redis.shared.answers import LATE, ONCE_SILENT, Answers
from switchboard.errors import BACKEND_RETRY, BackendError
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.testing import FaultProxy, ValkeyServer
from switchboard.testing.wait import eventually

# -- the rules, without I/O ------------------------------------------------------


def test_a_command_gives_up_its_patience_after_it_started_when_redis_answers_nobody() -> None:
    answers = Answers()
    assert answers.give_up_at(10.0, 0.75) == 10.75


def test_a_command_waits_on_while_redis_answers_other_commands() -> None:
    answers = Answers()
    answers.heard(10.5)  # a storm: Redis is slow for this one, but it answers
    assert answers.give_up_at(10.0, 0.75) == 11.25
    answers.heard(11.2)
    assert answers.give_up_at(10.0, 0.75) == pytest.approx(11.95)


def test_once_a_command_gave_up_the_next_ones_wait_only_briefly_until_redis_answers_again() -> None:
    answers = Answers()
    answers.heard(9.0)
    answers.gave_up()
    assert answers.give_up_at(10.0, 0.75) == pytest.approx(10.0 + ONCE_SILENT)
    answers.heard(10.1)  # back: full patience again
    assert answers.give_up_at(10.2, 0.75) == pytest.approx(10.95)


def test_a_check_that_comes_late_looks_again_rather_than_give_up() -> None:
    """The loop was held (other work): answers Redis sent meanwhile may not have been read yet."""
    answers = Answers()
    assert answers.next_check(10.0, 0.75, now=10.76, planned=10.75) is None  # on time: gives up
    assert answers.next_check(10.0, 0.75, now=11.5, planned=10.75) == pytest.approx(11.5 + LATE)
    answers.heard(11.52)  # read once the loop turned
    assert answers.next_check(10.0, 0.75, now=11.6, planned=11.6) == pytest.approx(12.27)


def test_patience_must_be_a_positive_number_of_seconds() -> None:
    with pytest.raises(ValueError, match="above 0"), patience(0):
        pass


# -- the client, against a blackholed Valkey --------------------------------------


@pytest.fixture
async def cut(valkey: ValkeyServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", valkey.port, connect_timeout=2.0) as proxy:
        yield proxy


async def test_a_requests_command_fails_retryably_once_redis_is_silent_for_its_patience(cut: FaultProxy) -> None:
    registry = RedisRegistry(cut.url_for_redis(), replica_id="r1")  # its own client, closed with it
    query = ServiceQuery("ws", "*", "*")
    loop = asyncio.get_running_loop()
    try:
        assert await registry.find(query) == []  # answered: a pooled connection is open
        cut.blackhole()
        started = loop.time()
        with patience(0.3), pytest.raises(BackendError) as failed:
            await registry.find(query)
        took = loop.time() - started
        assert 0.25 < took < 0.6, f"gave up after {took:.2f} s"
        assert str(failed.value).startswith(BACKEND_RETRY), str(failed.value)
        started = loop.time()
        with patience(0.3), pytest.raises(BackendError):  # known silent: the next gives up sooner
            await registry.find(query)
        assert loop.time() - started < 0.3
        cut.pass_through()
        with patience(0.3):
            assert await registry.find(query) == []  # back: served at once
    finally:
        cut.pass_through()
        await registry.close()


async def test_the_replicas_own_commands_keep_the_whole_command_timeout(cut: FaultProxy) -> None:
    client = make_client(cut.url_for_redis(), timeout=0.6)
    loop = asyncio.get_running_loop()
    try:
        assert await client.ping()
        cut.blackhole()
        started = loop.time()
        with pytest.raises(RedisTimeoutError):
            await client.ping()  # no patience set: redis-py's own socket timeout
        assert loop.time() - started >= 0.55
    finally:
        cut.pass_through()
        await client.aclose()


async def test_a_pipeline_made_for_a_request_is_as_patient(cut: FaultProxy) -> None:
    client = make_client(cut.url_for_redis())
    loop = asyncio.get_running_loop()
    try:
        assert await client.ping()
        cut.blackhole()
        pipe = client.pipeline(transaction=False)
        pipe.get("a")
        pipe.get("b")
        started = loop.time()
        with patience(0.3), pytest.raises(RedisTimeoutError, match="has not answered"):
            await pipe.execute()
        assert loop.time() - started < 0.6
    finally:
        cut.pass_through()
        await client.aclose()


async def test_a_connection_given_up_during_its_handshake_is_not_reused_half_done(
    cut: FaultProxy, valkey: ValkeyServer
) -> None:
    """Its handshake's answer (``CLIENT SETNAME``'s OK) must not be read as a later command's."""
    with valkey.client() as admin:
        admin.set("patient-key", "value")
    client = make_client(cut.url_for_redis(), client_name="sb-patient-test", max_connections=1)
    try:
        cut.blackhole()
        with patience(0.2), pytest.raises(RedisTimeoutError):
            await client.get("patient-key")  # a new connection: cancelled in its handshake
        cut.pass_through()
        assert await client.get("patient-key") == b"value"
        assert await client.get("patient-key") == b"value"
    finally:
        cut.pass_through()
        await client.aclose()


def sent(proxy: FaultProxy, key: bytes) -> bool:
    """Whether a command naming ``key`` reached the proxy (recorded since :meth:`FaultProxy.record`)."""
    return any(key in data for _, data in proxy.recorded())


async def test_a_command_with_less_patience_gives_up_before_one_started_earlier_with_more(cut: FaultProxy) -> None:
    """One timer looks at every command in flight: a later command with less to wait is looked at
    when its own patience ends, not when the earlier command's does."""
    client = make_client(cut.url_for_redis())
    loop = asyncio.get_running_loop()
    ended: dict[str, float] = {}

    async def wait(name: str, seconds: float) -> None:
        with patience(seconds), pytest.raises(RedisTimeoutError, match="has not answered"):
            await client.get(name)
        ended[name] = loop.time()

    try:
        assert await client.ping()
        cut.blackhole()
        started = loop.time()
        cut.record()
        long = asyncio.create_task(wait("long", 1.5))
        await eventually(lambda: sent(cut, b"long"), "the long one's GET reached the proxy")
        await asyncio.wait_for(wait("short", 0.2), 5)
        await asyncio.wait_for(long, 5)
        assert ended["short"] - started < 0.9, f"the short one gave up after {ended['short'] - started:.2f} s"
        assert ended["long"] - started >= 1.4
    finally:
        cut.pass_through()
        await client.aclose()


async def test_a_patient_command_cancelled_from_elsewhere_is_cancelled_not_given_up(cut: FaultProxy) -> None:
    client = make_client(cut.url_for_redis())
    try:
        assert await client.ping()
        cut.blackhole()

        async def patient_get() -> None:
            with patience(5):
                await client.get("cancelled-key")

        cut.record()
        task = asyncio.create_task(patient_get())
        await eventually(lambda: sent(cut, b"cancelled-key"), "its GET reached the proxy")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
        cut.pass_through()
        with patience(0.5):
            assert await client.get("cancelled-key") is None  # the next command is not given up by a stale look
    finally:
        cut.pass_through()
        await client.aclose()
