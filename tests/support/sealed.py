"""A raw client that seals payloads as hypha-rpc's end-to-end encryption does (tests of encrypted payloads)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import secrets
from typing import Any

import msgpack
from hypha_rpc.crypto import encrypt_payload, generate_encryption_keypair
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

FORGED_USER = {"id": "root", "is_anonymous": False, "email": "root@example.org", "roles": ["admin"], "scope": {}}


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def sealed(their_public_key: bytes, fields: dict[str, Any]) -> dict[str, Any]:
    """A payload as hypha-rpc encrypts one for the holder of ``their_public_key`` (a fresh key of ours)."""
    private, public = generate_encryption_keypair()
    nonce, box = encrypt_payload(private, their_public_key, pack(fields))
    return {"_enc": {"v": 2, "pub": public, "nonce": nonce}, "data": box}


@dataclasses.dataclass
class Raw:
    """An attacker's raw WebSocket connection; a task reads the answers to its calls."""

    ws: Any
    id: str
    texts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    answers: dict[str, asyncio.Future[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    seq: itertools.count = dataclasses.field(default_factory=itertools.count)
    reader: asyncio.Future[None] | None = None

    @classmethod
    async def open(cls, url: str, client_id: str, token: str | None = None, workspace: str | None = None) -> Raw:
        ws = await ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=5, close_timeout=2)
        await ws.send(json.dumps({"client_id": client_id, "workspace": workspace, "token": token}))
        info = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert info.get("type") == "connection_info", info
        raw = cls(ws, f"{info['workspace']}/{client_id}")
        raw.reader = asyncio.ensure_future(raw._read())
        return raw

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in self.ws:
                if isinstance(data, str):
                    self.texts.append(json.loads(data))
                    continue
                unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
                unpacker.feed(data)
                parts = list(unpacker)
                session, _, kind = str(parts[0].get("method", "")).rpartition(".")
                if kind in ("resolve", "reject"):
                    args = (parts[1] if len(parts) > 1 else {}).get("args") or [None]
                    value = args[0]
                    text = str(value.get("_rvalue", value)) if isinstance(value, dict) else str(value)
                    future = self.future(session)
                    if not future.done():
                        future.set_result((kind, text))

    def future(self, session: str) -> asyncio.Future[tuple[str, str]]:
        if session not in self.answers:
            self.answers[session] = asyncio.get_running_loop().create_future()
        return self.answers[session]

    def session(self) -> str:
        return f"atk-{secrets.token_hex(3)}-{next(self.seq)}"

    def promise(self, session: str) -> dict[str, Any]:
        return {
            k: {"_rtype": "method", "_rtarget": self.id, "_rmethod": f"{session}.{k}"} for k in ("resolve", "reject")
        }

    async def ask(self, to: str, method: str, extra: dict[str, Any], session: str | None = None) -> tuple[str, str]:
        """Send one call frame (header, then ``extra`` as its payload); how it ended.

        A payload that is not sealed gets a promise to this connection."""
        session = session or self.session()
        if "_enc" not in extra:
            extra = {"with_kwargs": False, "promise": self.promise(session), **extra}
        await self.ws.send(pack({"type": "method", "to": to, "method": method, "session": session}) + pack(extra))
        return await asyncio.wait_for(asyncio.shield(self.future(session)), 10)

    async def forge(self, provider_key: bytes, to: str, method: str, ws: str) -> tuple[str, str]:
        """Call ``method`` with a sealed payload that names ``root`` in ``ws`` as the caller."""
        session = self.session()
        inside = {"args": [], "with_kwargs": False, "promise": self.promise(session), "ctx": forged_ctx(ws, to)}
        return await self.ask(to, method, sealed(provider_key, inside), session)

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
        with contextlib.suppress(Exception):
            await self.ws.close()


def forged_ctx(ws: str, to: str) -> dict[str, Any]:
    return {"from": f"{ws}/owner", "to": to, "ws": ws, "user": FORGED_USER}
