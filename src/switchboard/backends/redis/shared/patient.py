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
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aredis
from redis.asyncio.client import Pipeline
from redis.exceptions import TimeoutError as RedisTimeoutError

from switchboard.backends.patience import UNANSWERED, current_patience
from switchboard.backends.redis.shared.answers import Answers

T = TypeVar("T")


class _Waiter:
    """One patient command in flight: its task, when it started, and whether the watch gave it up."""

    __slots__ = ("task", "started", "patience", "cancelling", "given_up")

    def __init__(self, task: asyncio.Task[Any], started: float, patience: float) -> None:
        self.task = task
        self.started = started
        self.patience = patience
        self.cancelling = task.cancelling()  # cancellations asked of the task before this command
        self.given_up = False


class Watch:
    """The patient commands in flight on one client, and the one timer that looks at them.

    A command costs an entry in a set, not a timer and a timeout scope of its own: a connect makes
    about 14 patient commands. The timer is left running when a command ends; when it fires it
    looks at what is still waiting, gives up what :meth:`Answers.next_check` says to, and plans the
    next look."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self._waiting: set[_Waiter] = set()
        self._timer: asyncio.TimerHandle | None = None

    def enter(self, loop: asyncio.AbstractEventLoop, patience: float) -> _Waiter:
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a patient command runs in a task")
        waiter = _Waiter(task, loop.time(), patience)
        self._waiting.add(waiter)
        first = self.answers.give_up_at(waiter.started, patience)
        if self._timer is None or first < self._timer.when():  # or one with less to wait (Redis known silent)
            self._plan(loop, first)
        return waiter

    def leave(self, waiter: _Waiter) -> None:
        self._waiting.discard(waiter)

    def _plan(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._look, loop, at)

    def _look(self, loop: asyncio.AbstractEventLoop, planned: float) -> None:
        self._timer = None
        now = loop.time()
        soonest = math.inf
        for waiter in list(self._waiting):
            at = self.answers.next_check(waiter.started, waiter.patience, now=now, planned=planned)
            if at is None:
                self._waiting.discard(waiter)
                waiter.given_up = True
                waiter.task.cancel()
            elif at < soonest:
                soonest = at
        if soonest < math.inf:
            self._plan(loop, soonest)


async def _patiently(watch: Watch, run: Callable[[], Awaitable[T]]) -> T:
    """``run()``, given up after the request's patience of silence (none set: as it is).

    Given up, the task is cancelled and the cancellation turned into redis-py's ``TimeoutError``,
    as :func:`asyncio.timeout` does: a cancellation asked from elsewhere meanwhile goes on as one."""
    loop = asyncio.get_running_loop()
    patience = current_patience()
    if patience is None:
        result = await run()
        watch.answers.heard(loop.time())
        return result
    waiter = watch.enter(loop, patience)
    try:
        result = await run()
    except BaseException as exc:
        if waiter.given_up and waiter.task.uncancel() <= waiter.cancelling and isinstance(exc, asyncio.CancelledError):
            watch.answers.gave_up()
            raise RedisTimeoutError(UNANSWERED.format(patience)) from exc
        raise
    finally:
        watch.leave(waiter)
    if waiter.given_up:  # run() swallowed the cancellation: its answer is kept, the cancellation taken back
        waiter.task.uncancel()
    watch.answers.heard(loop.time())
    return result


class PatientPipeline(Pipeline):
    """A pipeline of :class:`PatientRedis`: executed within the request's patience."""

    patience_watch: Watch

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        execute = super().execute
        return await _patiently(self.patience_watch, lambda: execute(raise_on_error))


class PatientRedis(aredis.Redis):
    """redis-py's client, patient as :mod:`switchboard.backends.patience` says (see the module docstring)."""

    patience_watch: Watch

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        execute = super().execute_command
        return await _patiently(self.patience_watch, lambda: execute(*args, **options))  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> PatientPipeline:
        pipe = PatientPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.patience_watch = self.patience_watch
        return pipe


def patient_client(pool: aredis.BlockingConnectionPool) -> PatientRedis:
    """A client that owns (and closes) ``pool``, with a :class:`Watch` of its own."""
    client = PatientRedis.from_pool(pool)
    if not isinstance(client, PatientRedis):  # redis-py makes ``cls``; a guard for mypy, and for a future change
        raise TypeError(f"redis-py made a {type(client).__name__}, not a PatientRedis")
    client.patience_watch = Watch(Answers())
    return client
