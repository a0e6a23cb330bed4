"""A Redis client whose commands, made for a client's request, give up once Redis is silent.

:class:`PatientRedis` is redis-py's client (its pipelines too) with one
addition: within :func:`~switchboard.backends.patience.patience` a command
is cancelled once Redis has answered nobody for that long
(:class:`~switchboard.backends.redis.shared.answers.Answers` decides when), and
raises redis-py's ``TimeoutError`` with a retryable message, which the
stores turn into their ``BackendError`` as they do a socket timeout. redis-py
drops a connection whose command was cancelled, so nothing half-read is
reused, nor one cancelled in its handshake (``tests/backends/test_patient_redis.py``).
Outside a request's patience nothing changes but one clock read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aredis
from redis.asyncio.client import Pipeline
from redis.exceptions import TimeoutError as RedisTimeoutError

from switchboard.backends.patience import UNANSWERED, current_patience
from switchboard.backends.redis.shared.answers import Answers

T = TypeVar("T")


async def _patiently(answers: Answers, run: Callable[[], Awaitable[T]]) -> T:
    """``run()``, given up after the request's patience of silence (none set: as it is)."""
    loop = asyncio.get_running_loop()
    patience = current_patience()
    if patience is None:
        result = await run()
        answers.heard(loop.time())
        return result
    started = loop.time()
    timer: asyncio.TimerHandle | None = None
    try:
        async with asyncio.timeout(None) as bound:

            def check(planned: float) -> None:
                nonlocal timer
                now = loop.time()
                at = answers.next_check(started, patience, now=now, planned=planned)
                if at is None:
                    bound.reschedule(now)  # expires now: the command is cancelled
                else:
                    timer = loop.call_at(at, check, at)

            first = answers.give_up_at(started, patience)
            timer = loop.call_at(first, check, first)
            result = await run()
    except TimeoutError as exc:
        answers.gave_up()
        raise RedisTimeoutError(UNANSWERED.format(patience)) from exc
    finally:
        if timer is not None:
            timer.cancel()
    answers.heard(loop.time())
    return result


class PatientPipeline(Pipeline):
    """A pipeline of :class:`PatientRedis`: executed within the request's patience."""

    answers: Answers

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        execute = super().execute
        return await _patiently(self.answers, lambda: execute(raise_on_error))


class PatientRedis(aredis.Redis):
    """redis-py's client, patient as :mod:`switchboard.backends.patience` says (see the module docstring)."""

    answers: Answers

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        execute = super().execute_command
        return await _patiently(self.answers, lambda: execute(*args, **options))  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> PatientPipeline:
        pipe = PatientPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.answers = self.answers
        return pipe


def patient_client(pool: aredis.BlockingConnectionPool) -> PatientRedis:
    """A client that owns (and closes) ``pool``, with an :class:`Answers` of its own."""
    client = PatientRedis.from_pool(pool)
    if not isinstance(client, PatientRedis):  # redis-py makes ``cls``; a guard for mypy, and for a future change
        raise TypeError(f"redis-py made a {type(client).__name__}, not a PatientRedis")
    client.answers = Answers()
    return client
