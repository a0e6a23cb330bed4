"""A scripted hub endpoint for testing reconnect handling without sockets or real time.

Pass ``hub.dial`` to :class:`~switchboard.client.transport.Transport` (or to
``connect(dial=...)`` for transport-level checks) together with a
:class:`switchboard.testing.FakeClock`: each URL can be down (the dial raises
``ConnectionRefusedError``) until a time on that clock, refuse with an error
frame, or accept and answer the handshake. Accepted sockets can then be
closed from the "server" side with any close code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from switchboard.client.errors import SocketClosed
from switchboard.testing.clock import FakeClock


class StubSocket:
    """One accepted connection: answers the first frame, then records what the client sends."""

    def __init__(self, hub: StubHub, url: str) -> None:
        self.hub = hub
        self.url = url
        self.hello: dict[str, Any] | None = None
        self.sent: list[str | bytes] = []
        self.closed: SocketClosed | None = None
        self._inbox: asyncio.Queue[str | bytes | SocketClosed] = asyncio.Queue()

    async def send(self, data: str | bytes) -> None:
        if self.closed is not None:
            raise self.closed
        if self.hello is None:
            self.hello = json.loads(data)
            self.hub.hellos.append((self.url, self.hello))
            self._answer()
            return
        self.sent.append(data)

    async def recv(self) -> str | bytes:
        item = await self._inbox.get()
        if isinstance(item, SocketClosed):
            self.closed = item
            raise item
        return item

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed is None:
            self.closed = SocketClosed(code, reason)
            self._inbox.put_nowait(self.closed)

    def abort(self) -> None:
        if self.closed is None:
            self.closed = SocketClosed(1006, "aborted")
            self._inbox.put_nowait(self.closed)

    # -- the server's side --

    def push(self, frame: str | bytes) -> None:
        self._inbox.put_nowait(frame)

    def server_close(self, code: int = 1006, reason: str = "") -> None:
        """Close from the hub: 1006 for a crash, 1012 for a drain, ..."""
        self._inbox.put_nowait(SocketClosed(code, reason))

    def _answer(self) -> None:
        endpoint = self.hub.endpoint(self.url)
        assert self.hello is not None
        refusal = endpoint.refusal
        if refusal is None and self.hello.get("reconnection_token"):
            refusal = endpoint.refuse_resumes
        if refusal is not None:
            message, code = refusal
            self.push(json.dumps({"type": "error", "message": message}))
            self.server_close(code, message[:120])
            return
        self.hub.tokens += 1
        assert self.hello is not None
        self.push(
            json.dumps(
                {
                    "type": "connection_info",
                    "manager_id": self.hub.manager_id,
                    "workspace": self.hello.get("workspace") or self.hub.workspace,
                    "client_id": self.hello.get("client_id"),
                    "public_base_url": "http://stub.test",
                    "reconnection_token": f"rt-{self.hub.tokens}",
                    "reconnection_token_life_time": self.hub.token_lifetime,
                }
            )
        )

    def __repr__(self) -> str:
        return f"<StubSocket {self.url} closed={self.closed is not None}>"


@dataclass
class Endpoint:
    """What dialing one URL does now."""

    down_until: float | None = None  # refuse TCP until this clock time (inf: forever)
    refusal: tuple[str, int] | None = None  # answer with an error frame and this close code
    refuse_resumes: tuple[str, int] | None = None  # the same, only to a hello with a reconnection token
    dial_cost: float = 0.0  # clock seconds a failed dial takes (e.g. a connect timeout)
    fail: Callable[[], BaseException] | None = None  # raise this instead of refusing


@dataclass
class StubHub:
    """Endpoints by URL on one clock, and a record of every dial and first frame."""

    clock: FakeClock
    workspace: str = "ws-stub"
    manager_id: str = "manager-stub"
    token_lifetime: float = 172800.0
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    dials: list[tuple[float, str]] = field(default_factory=list)
    hellos: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sockets: list[StubSocket] = field(default_factory=list)
    tokens: int = 0

    def endpoint(self, url: str) -> Endpoint:
        return self.endpoints.setdefault(url, Endpoint())

    def down(self, url: str, *, until: float = float("inf"), dial_cost: float = 0.0) -> None:
        endpoint = self.endpoint(url)
        endpoint.down_until, endpoint.dial_cost = until, dial_cost

    def up(self, url: str) -> None:
        self.endpoints[url] = Endpoint()

    @property
    def live(self) -> StubSocket:
        """The newest accepted socket."""
        return self.sockets[-1]

    async def dial(self, url: str) -> StubSocket:
        self.dials.append((self.clock.monotonic(), url))
        endpoint = self.endpoint(url)
        if endpoint.fail is not None or (
            endpoint.down_until is not None and self.clock.monotonic() < endpoint.down_until
        ):
            self.clock.advance(endpoint.dial_cost)  # time spent, not a sleep of the client's
            if endpoint.fail is not None:
                raise endpoint.fail()
            raise ConnectionRefusedError(111, f"Connect call failed ({url})")
        sock = StubSocket(self, url)
        self.sockets.append(sock)
        return sock
