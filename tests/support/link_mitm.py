"""A host on the path of a replica link: relays its bytes, and injects, alters or replays a frame on cue.

Put it in front of a replica's link port (the replica advertises the relay's
port) and the link the other replica dials runs through it. It relays whole
frames (``u32 length | u8 kind | body``, the framing every link frame has
had), so what it writes into the stream lands between two frames, as an
attacker who can rewrite TCP segments would place it. ``down`` is the
listener's side to the dialler's: the direction the listener's DELIVERs take;
``up`` the other one (the dialler's acks and replies). It can also withhold
one direction of the current connection, or send the next DELIVER down twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from switchboard.protocol.link import link_wire as wire

Alter = Callable[[int, bytes], bytes | None]  # (kind, body) -> new body, or None to leave it


class LinkMitm:
    """A loopback relay to ``upstream`` (a link listener) that can tamper with the ``down`` stream."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.connections = 0
        self.down_frames: list[tuple[int, bytes]] = []  # every frame relayed down, as it was
        self.up_frames: list[tuple[int, bytes]] = []  # and up
        self._alter: Alter | None = None
        self._down: asyncio.StreamWriter | None = None  # the current connection's dialler side
        self.withheld: set[str] = set()  # directions of the current connection relayed no further
        self._double = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.altered = asyncio.Event()

    async def __aenter__(self) -> LinkMitm:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port: int = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.close()
        # cancelled, not left to read EOF: a connection still dialling the upstream has no socket to
        # close yet, and once it had one its pumps would wait on replicas that close after the relay
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def delivered(self, direction: str = "down") -> list[bytes]:
        """The DELIVER frames relayed ``direction`` so far, re-encoded exactly as they crossed."""
        frames = self.down_frames if direction == "down" else self.up_frames
        return [wire.encode(kind, body) for kind, body in frames if kind == wire.DELIVER]

    def inject(self, frame: bytes) -> None:
        """Write ``frame`` into the current connection's ``down`` stream, between two frames."""
        assert self._down is not None, "no link through the relay yet"
        self._down.write(frame)

    def withhold(self, direction: str) -> None:
        """Relay nothing more ``"up"`` or ``"down"`` on the current connection (its bytes are dropped)."""
        assert direction in ("up", "down")
        self.withheld.add(direction)

    def double_next(self) -> None:
        """Write the next DELIVER going down twice (once): the copy 20 ms after the original, and
        nothing more up from then on, so the ack of the original never reaches its sender, whose
        connection is cut as the copy goes (it sees the link lost at once)."""
        self._double = True

    def alter_next(self, alter: Alter) -> None:
        """Rewrite the next frame going down for which ``alter`` returns a body (once)."""
        self._alter = alter

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        self.connections += 1
        ends = [writer]  # this connection's two sockets, closed however it ends
        try:
            await self._pump(reader, writer, ends)
        except asyncio.CancelledError:
            pass  # the relay closed: the connection ends here (asyncio's streams would log a cancelled handler)
        finally:
            for end in ends:
                end.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ends: list[asyncio.StreamWriter]
    ) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        ends.append(up_writer)
        self._down = writer
        self.withheld = set()  # a new connection is relayed whole until told otherwise

        async def up() -> None:
            decoder = wire.Decoder(1 << 30)
            while data := await reader.read(65536):
                if "up" in self.withheld:
                    continue
                self.up_frames.extend(decoder.feed(data))
                up_writer.write(data)
                await up_writer.drain()
            up_writer.transport.abort()

        async def down() -> None:
            decoder = wire.Decoder(1 << 30)
            while data := await up_reader.read(65536):
                for kind, body in decoder.feed(data):
                    self.down_frames.append((kind, body))
                    if self._alter is not None and (changed := self._alter(kind, body)) is not None:
                        self._alter, body = None, changed
                        self.altered.set()
                    if "down" in self.withheld:
                        continue
                    writer.write(wire.encode(kind, body))
                    if self._double and kind == wire.DELIVER:
                        self._double = False
                        self.withheld.add("up")
                        await writer.drain()
                        await asyncio.sleep(0.02)  # the original is taken alone: the copy is a frame of its own
                        up_writer.transport.abort()
                        writer.write(wire.encode(kind, body))
                await writer.drain()
            writer.transport.abort()

        with contextlib.suppress(OSError):
            await asyncio.gather(up(), down())
