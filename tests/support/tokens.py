"""Credentials a test hands out, and a raw first frame to see exactly what the hub answers to a token."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import jwt
from websockets.asyncio.client import connect as ws_connect

from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import Permission, User, user_workspace
from switchboard.testing.hub import TEST_SECRET
from switchboard.testing.wait import eventually


def credential(user_id: str, expires_in: float, *, secret: str = TEST_SECRET) -> tuple[str, float]:
    """A token for ``user_id`` in its own workspace, and the moment it expires."""
    issuer = TokenIssuer(secret, SystemClock())
    user = User(id=user_id, roles=("user",))
    token = issuer.issue(user, workspace=user_workspace(user_id), permission=Permission.ADMIN, expires_in=expires_in)
    return token, float(claims(token)["exp"])


def claims(token: str) -> dict[str, Any]:
    return dict(jwt.decode(token, options={"verify_signature": False}))


async def first_reply(url: str, client_id: str, **hello: Any) -> dict[str, Any]:
    """Send a hello with raw frames, return the hub's first answer (``connection_info`` or ``error``), close."""
    async with ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=5, close_timeout=2) as ws:
        first = {"client_id": client_id, "workspace": None, "token": None, "reconnection_token": None}
        await ws.send(json.dumps({**first, **hello}))
        reply: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 5))
        return reply


async def past(moment: float) -> None:
    """Until the wall clock (which the hub checks tokens against) is past ``moment``."""
    await eventually(lambda: time.time() > moment + 0.05, f"the clock past {moment}", timeout=moment - time.time() + 5)


def resumption(user_id: str, client_id: str, *, secret: str, expires_in: float = 3600.0) -> str:
    """A reconnection token for ``client_id`` of ``user_id`` in its own workspace, as a hub with ``secret`` signs it."""
    clock = SystemClock()
    user = User(id=user_id, roles=("user",), credential_expires_at=clock.time() + expires_in)
    return TokenIssuer(secret, clock).issue(
        user,
        workspace=user_workspace(user_id),
        permission=Permission.ADMIN,
        expires_in=expires_in,
        client_id=client_id,
        resumes=True,
    )
