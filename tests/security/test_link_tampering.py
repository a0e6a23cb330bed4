"""A host on the path of an open link between two replicas injects, alters or replays a frame.

The handshake proves who opened a link; after it, every frame carries a
sequence number and a MAC under a key of that link alone (``protocol/link/link_wire.py``).
So a frame the host writes into the stream, changes, or sends a second time is
never delivered: the receiver drops the link, whose unacked frames go through
Redis, each delivered there only if the link had not delivered it (a call runs
once, whatever the host withholds or repeats), and traffic carries on. The host
here is a loopback relay in front of the listener's link port
(``support.link_mitm``) that relays whole frames, tampers with one on cue, or
withholds a direction; the replicas are real buses on a real Valkey, and in the
cluster tests real replica processes with hypha-rpc clients. And many
addresses hold half-open handshakes on a replica's link port, and clients
still connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import msgpack
import pytest
from hypha_rpc import connect_to_server

from support.link_mitm import LinkMitm
from support.linked import LinkedReplica as Replica
from support.linked import linked_replicas
from switchboard.protocol.hypha import envelope
from switchboard.protocol.link import link_wire as wire
from switchboard.protocol.link import replica_wire
from switchboard.testing import ValkeyServer
from switchboard.testing.ports import free_port
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually, scaled

pytestmark = pytest.mark.timeout(90)

SECRET = "tampering-test-secret-0123456789abcdef"
LINK_LOGGERS = ("switchboard.replicas.dataplane.links", "switchboard.replicas.dataplane.link")


@pytest.fixture(scope="module")
def valkey_tamper() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def buses(valkey_tamper: ValkeyServer) -> AsyncIterator[Callable[..., Any]]:
    async with linked_replicas(valkey_tamper.url, SECRET) as make:
        yield make


@pytest.fixture
async def mitm() -> AsyncIterator[LinkMitm]:
    async with LinkMitm(free_port()) as relay:
        yield relay


def channel() -> str:
    return f"sb:client:ws-{uuid.uuid4().hex[:6]}/c"


async def through_the_host(buses, mitm: LinkMitm) -> tuple[Replica, Replica, str, list[bytes]]:
    """``b`` dialled ``a`` through the host on the path, and ``a`` writes ``b``'s channel's frames to it."""
    a = await buses("a", port=mitm.upstream, advertise=f"127.0.0.1:{mitm.port}")
    b = await buses("b")
    ch, got = channel(), []
    await b.subscribe(ch, got.append)
    assert await a.publish(ch, b"first") == 1  # through Redis: b dials a, through the host
    await eventually(lambda: a.links.route_of(ch) == b.replica_id, "the link through the host")
    assert await a.publish(ch, b"over the link") == 1
    await eventually(lambda: got[-1:] == [b"over the link"], "a frame over the link")
    assert a.links.stats.direct == 1
    link = a.links._routes[ch]
    await eventually(lambda: not link.state.unacked, "the frame acked")  # else the drop would send it again
    assert mitm.connections == 1
    assert len(mitm.delivered()) == 1
    return a, b, ch, got


async def carried_on(a: Replica, got: list[bytes], ch: str) -> None:
    """A frame published after the tampering arrives (through Redis, or a link learned again)."""
    assert await a.publish(ch, b"afterwards") == 1
    await eventually(lambda: b"afterwards" in got, "traffic after the tampering")


async def test_an_injected_deliver_is_not_delivered_and_drops_the_link(buses, mitm) -> None:
    a, b, ch, got = await through_the_host(buses, mitm)

    mitm.inject(wire.deliver(ch, b"forged by the host on the path"))
    await carried_on(a, got, ch)

    assert b"forged by the host on the path" not in got
    assert b.links.stats.forged == 1
    assert got == [b"first", b"over the link", b"afterwards"]


async def test_an_altered_deliver_is_not_delivered_and_the_original_arrives_through_redis(buses, mitm) -> None:
    a, b, ch, got = await through_the_host(buses, mitm)

    def pay_999(kind: int, body: bytes) -> bytes | None:
        return body.replace(b"pay 100", b"pay 999") if kind == wire.DELIVER and b"pay 100" in body else None

    mitm.alter_next(pay_999)
    assert await a.publish(ch, b"pay 100 to alice") == 1
    await asyncio.wait_for(mitm.altered.wait(), scaled(5.0))
    await eventually(lambda: any(frame.startswith(b"pay") for frame in got), "the payment, one way or another")

    assert b"pay 999 to alice" not in got
    await eventually(lambda: b"pay 100 to alice" in got, "the original, unacked, through Redis")
    assert b.links.stats.forged == 1
    await carried_on(a, got, ch)
    assert got.count(b"pay 100 to alice") == 1


async def test_a_replayed_deliver_is_not_delivered_twice(buses, mitm) -> None:
    a, b, ch, got = await through_the_host(buses, mitm)
    assert await a.publish(ch, b"transfer 1") == 1
    await eventually(lambda: b"transfer 1" in got, "the transfer")
    recorded = mitm.delivered()[-1]
    link = a.links._routes[ch]
    await eventually(lambda: not link.state.unacked, "the transfer acked")

    mitm.inject(recorded)  # the same bytes again, later in the stream
    await carried_on(a, got, ch)

    assert got.count(b"transfer 1") == 1
    assert b.links.stats.forged == 1


# -- a link dropped on purpose: what it left unacked arrives once -------------------------------


async def test_a_deliver_the_host_sends_twice_is_delivered_once_though_the_link_drops(buses, mitm) -> None:
    a, b, ch, got = await through_the_host(buses, mitm)
    mitm.double_next()  # the host cuts a's side and sends a copy, which fails its number at b: no ack reaches a

    assert await a.publish(ch, b"transfer 1") == 1
    await eventually(lambda: b.links.stats.forged == 1, "the link dropped for the copy")
    await eventually(lambda: a.unicast.replayed == 1, "the unacked transfer sent again through Redis")
    await carried_on(a, got, ch)

    assert got.count(b"transfer 1") == 1, f"b was handed {got}"
    assert b.links.stats.duplicates == 1


CALL = b"\x85\xa4type\xa6method\xa4from\xa4ws/p\xa2to\xa4ws/c\xa6method\xa8s1.calc"  # a map, as frames are


@pytest.mark.parametrize(
    "wrapped",
    [replica_wire.wrap_balanced("ws/my balance.2|round_robin|calc", CALL), replica_wire.wrap_bounced("ws/q", CALL)],
    ids=["balanced", "bounced"],
)
async def test_a_balanced_or_bounced_call_the_host_sends_twice_is_delivered_once_though_the_link_drops(
    buses, mitm, wrapped: bytes
) -> None:
    a, b, ch, got = await through_the_host(buses, mitm)
    a.unicast.peer_versions.learn([{"id": b.replica_id, "reads": "2"}])  # b takes such a call over the link
    mitm.double_next()

    assert await a.publish(ch, wrapped) == 1
    await eventually(lambda: b.links.stats.forged == 1, "the link dropped for the copy")
    await eventually(lambda: a.unicast.replayed == 1, "the unacked call sent again through Redis")
    await carried_on(a, got, ch)

    assert got.count(wrapped) == 1, f"b was handed {got}"
    assert b.links.stats.duplicates == 1


# -- handshakes nobody finishes -----------------------------------------------------------------


@pytest.mark.alone
async def test_four_hundred_silent_connections_hold_few_handshakes_and_write_few_warnings(buses, caplog) -> None:
    caplog.set_level(logging.INFO, "switchboard.replicas")
    b = await buses("b")
    port = int(b.links.origin.rsplit(":", 1)[1])
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(400)]
    try:
        answers = await asyncio.gather(*(first_frame_or_close(reader) for reader, _ in conns))
        challenged = sum(kind == wire.CHALLENGE for kind in answers)
        assert challenged <= 16, f"{challenged} handshakes pending at once"
        from switchboard.protocol.link import link_gate

        assert challenged <= link_gate.MAX_PENDING_PER_ADDRESS, f"{challenged} handshakes pending at once"
        assert b.links.pending_handshakes <= link_gate.MAX_PENDING_PER_ADDRESS
        await eventually(lambda: b.links.stats.refused == 400, "every silent connection refused", timeout=10)
        assert b.links.pending_handshakes == 0
    finally:
        for _, writer in conns:
            writer.transport.abort()
    said = [r.getMessage() for r in caplog.records if r.name in LINK_LOGGERS and r.levelno >= logging.WARNING]
    assert len(said) <= 3, f"{len(said)} warning lines, the first ones: {said[:5]}"

    # the flood is over: a replica that dials b now gets its link
    c = await buses("c")
    ch = channel()
    await c.subscribe(ch, lambda _: None)
    assert await b.publish(ch, b"first") == 1  # through Redis: c dials b
    await eventually(lambda: b.links.route_of(ch) == c.replica_id, "a link from c to b")


class FewDescriptors(ReplicaProcess):
    """A replica process that may open at most ``nofile`` descriptors (RLIMIT_NOFILE), as on many hosts."""

    def __init__(self, *, nofile: int, **options: Any) -> None:
        super().__init__(**options)
        self.nofile = nofile

    def command(self) -> list[str]:
        serve = super().command()
        limit = f"resource.setrlimit(resource.RLIMIT_NOFILE, ({self.nofile}, {self.nofile}))"
        return [serve[0], "-c", f"import os, resource, sys; {limit}; os.execv(sys.argv[1], sys.argv[1:])", *serve]


@pytest.mark.cluster
@pytest.mark.alone
async def test_half_open_handshakes_from_many_addresses_leave_descriptors_for_clients(valkey_tamper) -> None:
    link_port = free_port()
    b = FewDescriptors(
        nofile=1024, replica_id="fds-b", redis_url=valkey_tamper.url, args=["--link-port", str(link_port)]
    )
    stop = asyncio.Event()
    opened: list[int] = []

    async def until_closed(reader: asyncio.StreamReader) -> bool:
        """Whether the replica wrote anything (its CHALLENGE) before it closed the connection or the test ended."""
        said = False
        stopped = asyncio.ensure_future(stop.wait())
        try:
            for _ in range(100):
                read = asyncio.ensure_future(reader.read(1 << 16))
                await asyncio.wait([read, stopped], return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    read.cancel()
                    return said
                if read.exception() is not None or not read.result():
                    return said
                said = True
        finally:
            stopped.cancel()
        return said

    async def hold(address: str) -> None:
        """One half-open handshake from ``address``: opened again at once when the replica closes it at its
        deadline, a second later when the replica turned it away unanswered."""
        for _ in range(20):
            challenged = False
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", link_port, local_addr=(address, 0))
                opened.append(1)
                try:
                    challenged = await until_closed(reader)
                finally:
                    writer.transport.abort()
            if stop.is_set():
                return
            if not challenged:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)

    client: Any = None
    holders: list[asyncio.Task[None]] = []
    try:
        b.start()
        # 70 addresses, 16 each (as many as one address may hold): 1,120 handshakes held open
        holders = [asyncio.create_task(hold(f"127.0.0.{i}")) for i in range(2, 72) for _ in range(16)]
        await eventually(lambda: len(opened) >= 1120, "the flood of half-open handshakes", timeout=20)
        # while the flood holds, the replica keeps descriptors to spare for clients (read off /proc for
        # 3.5 s, its handshake deadline and more, so every held handshake is counted; at most 40 looks)
        assert b.proc is not None
        loop = asyncio.get_running_loop()
        most, until = 0, loop.time() + 3.5
        for _ in range(40):
            most = max(most, len(os.listdir(f"/proc/{b.proc.pid}/fd")))
            if loop.time() > until:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
        assert most <= 1024 - 128, f"the flood took the replica to {most} of its 1024 descriptors"
        # and a client arriving while the flood holds connects
        client = await asyncio.wait_for(connect_to_server({"server_url": b.url, "client_id": "after"}), scaled(20.0))
        assert client.config["workspace"]
    finally:
        stop.set()
        await asyncio.gather(*holders, return_exceptions=True)
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 5)
        b.kill()


async def first_frame_or_close(reader: asyncio.StreamReader) -> int | None:
    """The kind of the first frame the listener sends, or ``None`` if it closes the connection first."""
    try:
        head = await asyncio.wait_for(reader.readexactly(5), scaled(5.0))
    except (asyncio.IncompleteReadError, ConnectionResetError):
        return None
    return head[4]


# -- the provider of a protected service, behind real replica processes ---------------------------


def forged_call(workspace: str) -> bytes:
    """A call to ``prov``'s protected ``act`` as the hub would stamp it, from a user named root."""
    head = {
        "type": "method",
        "to": f"{workspace}/prov",
        "method": "services.prot.act",
        "session": "forged-session",
        "from": f"{workspace}/forged",
        "ws": workspace,
        "user": {"id": "root", "is_anonymous": False, "email": "root@example.com", "roles": ["admin"]},
    }
    return envelope.encode(head, msgpack.packb({"args": ["forged"], "with_kwargs": False}, use_bin_type=True))


async def metric(url: str, name: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics", timeout=5)).text
    found = re.search(rf'^{name}(?:_total)?{{replica="[^"]+"}} ([0-9.e+]+)$', text, re.M)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


@contextlib.asynccontextmanager
async def through_the_host_processes(
    valkey: ValkeyServer, mitm: LinkMitm, name: str
) -> AsyncIterator[tuple[ReplicaProcess, ReplicaProcess, Any, list[Any]]]:
    """Replica processes A and B whose one link is A's, through the host (A advertises a port
    nobody listens on, so B's dial to it fails), and a hypha-rpc client ``prov`` on A. Yields
    A, B, the provider and a list of clients to disconnect at the end."""
    a = ReplicaProcess(
        replica_id=f"{name}-a", redis_url=valkey.url, args=["--link-advertise", f"127.0.0.1:{free_port()}"]
    )
    b = ReplicaProcess(
        replica_id=f"{name}-b",
        redis_url=valkey.url,
        args=["--link-port", str(mitm.upstream), "--link-advertise", f"127.0.0.1:{mitm.port}"],
    )
    made: list[Any] = []
    try:
        a.start()
        b.start()
        provider = await connect_to_server({"server_url": a.url, "client_id": "prov", "method_timeout": 20})
        made.append(provider)
        yield a, b, provider, made
    finally:
        for api in reversed(made):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(api.disconnect(), 5)
        a.kill()
        b.kill()


@pytest.mark.cluster
async def test_a_deliver_injected_between_replicas_never_runs_a_protected_call_as_a_forged_user(
    valkey_tamper, mitm
) -> None:
    async with through_the_host_processes(valkey_tamper, mitm, "tamper") as (a, b, provider, made):
        workspace = provider.config["workspace"]
        ran: list[tuple[str, str]] = []

        def act(*args: Any, context: dict[str, Any] | None = None) -> str:
            ctx = context or {}
            ran.append((ctx.get("from", ""), (ctx.get("user") or {}).get("id", "")))
            return "done"

        await provider.register_service(
            {"id": "prot", "config": {"visibility": "protected", "require_context": True}, "act": act}
        )
        token = await provider.generate_token()
        member = await connect_to_server(
            {"server_url": b.url, "client_id": "member", "token": token, "method_timeout": 20}
        )
        made.append(member)
        prot = await member.get_service("prov:prot")

        async def a_call_crossed_the_link() -> bool:
            """The first call goes through Redis, and A dials B's link (through the host) meanwhile:
            calls go on until one takes the link, however long the dial takes."""
            assert await prot.act() == "done"
            return bool(mitm.delivered())

        await eventually(a_call_crossed_the_link, "calls from B to A over the link through the host", interval=0.05)
        assert all(user != "root" for _, user in ran)
        legit = len(ran)

        mitm.inject(wire.deliver(f"sb:client:{workspace}/prov", forged_call(workspace)))
        for _ in range(3):  # the member's calls carry on, through Redis if the link is gone
            assert await asyncio.wait_for(prot.act(), 15) == "done"

        assert [user for _, user in ran[legit:]] == [ran[0][1]] * 3, f"the provider ran {ran[legit:]}"
        assert all(sender != f"{workspace}/forged" for sender, _ in ran)
        assert await metric(a.url, "switchboard_link_forged") == 1


@pytest.mark.cluster
@pytest.mark.parametrize("attack", ["withhold acks", "send a call twice"])
async def test_a_call_reaches_its_provider_once_when_the_host_drops_the_link_between_replicas(
    valkey_tamper, mitm, attack: str
) -> None:
    async with through_the_host_processes(valkey_tamper, mitm, "once") as (a, b, provider, made):
        ran: list[str] = []
        await provider.register_service({"id": "bank", "pay": lambda what: ran.append(what) or "paid"})
        member = await connect_to_server(
            {"server_url": b.url, "client_id": "member", "token": await provider.generate_token()}
        )
        made.append(member)
        bank = await member.get_service("prov:bank")
        to_provider = f"sb:client:{provider.config['workspace']}/prov".encode()
        to_member = f"sb:client:{provider.config['workspace']}/member".encode()

        async def calls_and_replies_cross_the_link() -> bool:
            assert await bank.pay("warm-up") == "paid"
            return any(to_provider in f for f in mitm.delivered("down")) and any(
                to_member in f for f in mitm.delivered("up")
            )

        await eventually(
            calls_and_replies_cross_the_link, "calls and replies over the link through the host", interval=0.05
        )
        if attack == "withhold acks":
            mitm.withhold("up")  # A's acks and replies never reach B: B drops the link as silent
            payments = [f"payment {i}" for i in range(4)]
        else:
            mitm.double_next()  # A takes the first copy, drops the link at the second, before it acks
            payments = ["payment 0"]
        replies = await asyncio.wait_for(asyncio.gather(*(bank.pay(p) for p in payments)), 20)

        assert replies == ["paid"] * len(payments)
        assert await asyncio.wait_for(bank.pay("afterwards"), 15) == "paid"
        assert [ran.count(p) for p in payments] == [1] * len(payments), f"the provider ran {ran}"
        if attack == "withhold acks":  # the replies never came back: the calls were sent again, and recognised
            assert await metric(b.url, "switchboard_link_frames_replayed") >= len(payments)
            assert await metric(a.url, "switchboard_link_frames_duplicate") == len(payments)
        else:  # A dropped the link at the copy (its reply, sent again through Redis, may beat B's own drop)
            assert await metric(a.url, "switchboard_link_forged") == 1
