"""Per-client scripts of many tasks sent together: a crowd leaving at once costs a few round trips.

Each client that connects or leaves runs a script or a few (its connection
count, its transit mark, its registrations' removal). One task per client,
each taking a pooled connection for its one script, ran a replica out of
connections when 10,000 clients dropped at once ("No connection available"
after the pool's 2 s wait, thousands of times: counts never released,
registrations left behind). A :class:`Batcher` queues such calls instead: one
task sends what is queued as one pipeline (up to :data:`BATCH` calls, one
connection, one round trip), and whatever arrived meanwhile goes in the next.
A lone call, with nothing queued or in flight, goes at once from its caller's
task as a plain command (no task, no pipeline: a publish costs what it did
before); a crowd waits one round trip per :data:`BATCH` calls.

Calls are sent as ``EVALSHA``; a script Redis does not have (restarted empty,
or flushed) is loaded (on every master of a cluster) and its calls sent again,
once. It works the same on a cluster client: the registry's keys share one hash
tag, so a pipeline of them goes to one master.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError, RedisError

# Calls per pipeline: a few milliseconds of Redis's time, far below the 2 s socket timeout,
# so that no pipeline holds Redis (or the replies behind it) long.
BATCH = 500


@dataclass(slots=True)
class _Call:
    script: Any  # a script registered on the batcher's client (redis-py's AsyncScript); None: a command
    keys: Sequence[Any]
    args: Sequence[Any]
    reply: asyncio.Future[Any]


class Batcher:
    """Script calls of many tasks, sent in pipelines by one task, over one connection at a time."""

    def __init__(self, redis: Any, *, limit: int = BATCH) -> None:
        self._r = redis
        self.limit = limit
        self._queue: deque[_Call] = deque()
        self._sender: asyncio.Task[None] | None = None
        self._alone: asyncio.Future[None] | None = None  # done once a lone call sent at once is answered
        self._closed = False
        self.pipelines = 0  # round trips so far, a pipeline or a lone call: how much was batched (tests, benches)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def run(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run ``script`` in the next pipeline: its reply, or the :class:`RedisError` it (or its
        pipeline) failed with."""
        return await self._queued(_Call(script, keys, args, self._future()))

    async def command(self, *args: Any) -> Any:
        """Run one command (``PUBLISH``, ...) in the next pipeline: its reply, or its error."""
        return await self._queued(_Call(None, (), args, self._future()))

    async def commands(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Run several commands together, in order, in the next pipeline (several pipelines past
        :attr:`limit`): each one's reply, or the :class:`RedisError` it failed with, in its place.
        With nothing queued or in flight, they go at once from the caller's task as one pipeline."""
        if self._closed:
            raise RedisError("closed")
        calls = [_Call(None, (), tuple(args), self._future()) for args in commands]
        if self._sender is None and self._alone is None:
            self._alone = done = asyncio.get_running_loop().create_future()
            try:
                await self._pipeline(calls)
            finally:
                self._alone = None
                done.set_result(None)
        else:
            self._queue.extend(calls)
            if self._sender is None:
                self._sender = asyncio.create_task(self._send(), name="redis batch")
        replies: list[Any] = []
        for call in calls:
            try:
                replies.append(await call.reply)
            except RedisError as exc:
                replies.append(exc)
        return replies

    @staticmethod
    def _future() -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _queued(self, call: _Call) -> Any:
        if self._closed:  # its client is closed, or about to be: no connection is opened again
            raise RedisError("closed")
        if self._sender is None and self._alone is None:
            return await self._by_itself(call)
        self._queue.append(call)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send(), name="redis batch")
        return await call.reply

    async def _by_itself(self, call: _Call) -> Any:
        """A call with nothing queued or in flight goes at once from its caller's task (no task
        to start, no pipeline: the common case of a lone publish); calls that come meanwhile
        queue behind it, and the sender waits for it, so their order holds."""
        self._alone = done = asyncio.get_running_loop().create_future()
        self.pipelines += 1
        try:
            try:
                return await self._r.execute_command(*_command(call))
            except NoScriptError:  # Redis lost it (restarted empty, flushed): load it, send again, once
                await self._r.script_load(call.script.script)
                return await self._r.execute_command(*_command(call))
        finally:
            self._alone = None
            done.set_result(None)

    async def _send(self) -> None:
        batch: list[_Call] = []
        try:
            if self._alone is not None:  # a lone call still on its way: those queued behind it go after
                await asyncio.shield(self._alone)
            while self._queue:
                batch = []
                while self._queue and len(batch) < self.limit:
                    call = self._queue.popleft()
                    if not call.reply.done():  # its caller gave up waiting: not sent at all
                        batch.append(call)
                if batch:
                    await self._pipeline(batch)
        except BaseException as exc:  # cancelled (shutdown), or a bug: nobody may wait for ever
            _fail([*batch, *self._queue], RedisError(f"not sent: {exc!r}"))
            self._queue.clear()
            raise
        finally:
            self._sender = None

    async def _pipeline(self, batch: list[_Call]) -> None:
        try:
            replies = await self._execute(batch)
            unknown = sorted(
                {c.script.script for c, r in zip(batch, replies, strict=True) if c.script and _noscript(r)}
            )
            if unknown:  # Redis lost them: load each once, then send its calls again
                for source in unknown:
                    await self._r.script_load(source)
                again = [i for i, r in enumerate(replies) if batch[i].script and _noscript(r)]
                for i, reply in zip(again, await self._execute([batch[i] for i in again]), strict=True):
                    replies[i] = reply
        except (RedisError, OSError) as exc:
            _fail(batch, exc if isinstance(exc, RedisError) else RedisError(str(exc)))
            return
        for call, reply in zip(batch, replies, strict=True):
            if call.reply.done():
                continue
            if isinstance(reply, Exception):
                call.reply.set_exception(reply)
            else:
                call.reply.set_result(reply)

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        async with self._r.pipeline(transaction=False) as pipe:
            for call in batch:
                pipe.execute_command(*_command(call))
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        self.pipelines += 1
        return replies

    async def close(self) -> None:
        """Let what is queued go out (bounded by the socket timeouts), then stop; later calls fail."""
        self._closed = True
        if self._alone is not None:  # a lone call on its way: answered before its client closes
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._alone), 5.0)
        sender = self._sender
        if sender is None:
            return
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(sender), 5.0)
        if not sender.done():
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender


def _command(call: _Call) -> tuple[Any, ...]:
    if call.script is None:
        return tuple(call.args)
    return ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)


def _noscript(reply: Any) -> bool:
    return isinstance(reply, NoScriptError)


def _fail(calls: Sequence[_Call], failure: RedisError) -> None:
    for call in calls:
        if not call.reply.done():
            call.reply.set_exception(failure)
