"""A client's connection as the hub's ``Peer`` sees it, for hubs driven without sockets: the one
fake transport of the tests (``paused``, it stalls like a client that stopped reading)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import msgpack

if TYPE_CHECKING:
    from switchboard.hub.hub import Hub
    from switchboard.hub.identity.users import User
    from switchboard.hub.sessions.peer import Peer


class Wire:
    """Takes every frame at once and keeps it, in order; while ``paused`` it takes none, and a
    writer waits until :meth:`resume`."""

    def __init__(self) -> None:
        self.frames: list[bytes | str] = []
        self.paused = False
        self.direct = 0  # frames taken by try_send: they went out without the writer task
        self.closed_with: tuple[int, str] | None = None
        self._resumed = asyncio.Event()

    def try_send(self, frame: bytes | str) -> bool:
        if self.paused:
            return False
        self.frames.append(frame)
        self.direct += 1
        return True

    async def send_bytes(self, data: bytes) -> None:
        await self._send(data)

    async def send_text(self, text: str) -> None:
        await self._send(text)

    async def _send(self, frame: bytes | str) -> None:
        while self.paused:
            self._resumed.clear()
            await self._resumed.wait()
        self.frames.append(frame)

    async def close(self, code: int, reason: str) -> None:
        self.closed_with = (code, reason)

    def resume(self) -> None:
        self.paused = False
        self._resumed.set()

    def heads(self) -> list[dict[str, Any]]:
        """The routing header (first msgpack object) of every binary frame."""
        return [first_object(f) for f in self.frames if isinstance(f, bytes)]

    def methods(self) -> list[str]:
        return [str(h.get("method", h["type"])) for h in self.heads()]

    def controls(self) -> list[dict[str, Any]]:
        """Every frame as a JSON control frame; an error if one is not."""
        return [json.loads(f) for f in self.frames]


def first_object(frame: bytes) -> dict[str, Any]:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame)
    head: dict[str, Any] = next(unpacker)
    return head


async def settle() -> None:
    """Let the tasks the hub spawned run to their next wait (bounded: 20 turns of the loop)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def attach_client(
    hub: Hub,
    workspace: str,
    client_id: str,
    user: User,
    *,
    reconnecting: bool = False,
    services: tuple[str, ...] = (),
    events: tuple[str, ...] = (),
) -> tuple[Peer, Wire, asyncio.Task[None]]:
    """A client of ``hub`` on a :class:`Wire`, as the server attaches one: its ``built-in`` and
    ``services`` registered, ``events`` subscribed, its writer running (the caller cancels it)."""
    from switchboard.hub.sessions.peer import Peer

    wire = Wire()
    peer = Peer(
        workspace=workspace,
        client_id=client_id,
        user=user,
        transport=wire,
        max_queue_bytes=1 << 20,
        replica_id=hub.replica_id,
    )
    await hub.attach(peer, reconnecting=reconnecting)
    hub.subscribers.add(peer, events)
    for name in ("built-in", *services):
        info = {"id": f"{workspace}/{client_id}:{name}", "name": name, "config": {"visibility": "public"}}
        hub.manager.hub.announced.add(peer, info, len(json.dumps(info)))  # type: ignore[arg-type]
        await hub.registry.register(info)  # type: ignore[arg-type]
    writer = asyncio.create_task(peer.run_writer())
    await settle()
    return peer, wire, writer
