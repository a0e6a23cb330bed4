"""An attacker who recorded a replica's link handshake replays it: no link opens, nothing is delivered.

Replicas sharing one Redis open direct TCP links to each other, and a link
that passed its handshake hands DELIVER frames to this replica's clients as
if they came from the hub. So bytes recorded off the wire must open nothing
when sent again, neither to the replica they were meant for nor to another.
Real buses on a real Valkey and real sockets; the attacker has only the bytes
a tap in front of the listener recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from support.linked import LinkedReplica as Replica
from support.linked import linked_replicas
from switchboard.protocol.link import link_wire as wire
from switchboard.testing import ValkeyServer
from switchboard.testing.ports import free_port
from switchboard.testing.wait import eventually, scaled

pytestmark = pytest.mark.timeout(60)

SECRET = "replay-test-secret"
DEADLINE = scaled(5.0)


class Tap:
    """A loopback relay to ``port`` that keeps what each client sent (the attacker's recording)."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.sent: list[bytearray] = []  # per connection, client -> upstream
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> Tap:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()  # each relay then reads EOF and ends
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        sent = bytearray()
        self.sent.append(sent)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self._writers += [writer, up_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, keep: bytearray | None) -> None:
            while data := await src.read(65536):
                if keep is not None:
                    keep += data
                dst.write(data)
                await dst.drain()
            dst.transport.abort()

        with contextlib.suppress(OSError):
            await asyncio.gather(pump(reader, up_writer, sent), pump(up_reader, writer, None))


@pytest.fixture(scope="module")
def valkey_replay() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def buses(valkey_replay: ValkeyServer) -> AsyncIterator[Callable[..., Any]]:
    """Started replicas with links on loopback, all closed after the test."""
    async with linked_replicas(valkey_replay.url, SECRET) as make:
        yield make


def channel() -> str:
    return f"sb:client:ws-{uuid.uuid4().hex[:6]}/c"


def link_port(replica: Replica) -> int:
    return int(replica.links.origin.rsplit(":", 1)[1])


@pytest.fixture
async def tap() -> AsyncIterator[Tap]:
    async with Tap(free_port()) as relay:
        yield relay


async def recorded_handshake(buses, tap: Tap) -> tuple[Replica, Replica, str, list[bytes], bytes]:
    """``b`` dials ``a`` through ``tap`` and links; both, ``b``'s channel, what it got, and the tape."""
    a = await buses("a", port=tap.upstream, advertise=f"127.0.0.1:{tap.port}")
    b = await buses("b")
    ch, got = channel(), []
    await b.subscribe(ch, got.append)
    assert await a.publish(ch, b"first") == 1  # through Redis: b then dials a, via the tap
    await eventually(lambda: a.links.route_of(ch) == b.replica_id, "the legitimate link")
    assert len(tap.sent) == 1
    assert tap.sent[0]
    return a, b, ch, got, bytes(tap.sent[0])


async def replay(port: int, tape: bytes, then: bytes) -> tuple[list[int], bool]:
    """Send ``tape`` and then ``then`` on a fresh connection: the kinds of frames answered, and
    whether the listener closed it within ``DEADLINE``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer, closed = bytearray(), False
    try:
        writer.write(tape + then)  # one write: the listener has it all before it can answer
        await writer.drain()
        async with asyncio.timeout(DEADLINE):
            while data := await reader.read(65536):
                answer += data
            closed = True
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    except TimeoutError:
        pass  # still open
    finally:
        writer.transport.abort()
    return [kind for kind, _ in wire.Decoder(1 << 20).feed(bytes(answer))], closed


async def test_a_replayed_hello_opens_no_link_and_delivers_nothing(buses, tap) -> None:
    a, b, ch_b, on_b, tape = await recorded_handshake(buses, tap)
    ch_a, on_a = channel(), []
    await a.subscribe(ch_a, on_a.append)  # a client of a's: what the attacker is after
    refused = a.links.stats.refused

    kinds, closed = await replay(link_port(a), tape, wire.deliver(ch_a, b"forged by the attacker"))

    assert wire.WELCOME not in kinds
    assert closed
    assert on_a == []
    await eventually(lambda: a.links.stats.refused == refused + 1, "the replay counted as refused")
    # the legitimate link is untouched: a's frames for b still go straight to it
    direct = a.links.stats.direct
    assert await a.publish(ch_b, b"still direct") == 1
    await eventually(lambda: on_b[-1:] == [b"still direct"], "delivery over the legitimate link")
    assert a.links.stats.direct == direct + 1
    assert a.links.route_of(ch_b) == b.replica_id


async def test_a_hello_recorded_for_one_replica_is_refused_by_another(buses, tap) -> None:
    _, _, _, _, tape = await recorded_handshake(buses, tap)
    c = await buses("c")  # same hub secret, but the HELLO was never meant for it
    ch_c, on_c = channel(), []
    await c.subscribe(ch_c, on_c.append)

    kinds, closed = await replay(link_port(c), tape, wire.deliver(ch_c, b"forged by the attacker"))

    assert wire.WELCOME not in kinds
    assert closed
    assert on_c == []
    await eventually(lambda: c.links.stats.refused == 1, "the replay counted as refused")
