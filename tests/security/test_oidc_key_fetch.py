"""Fetching a provider's keys is bounded as a whole: one deadline, a size cap, https unless allowed (issue 37).

Whoever answers for the provider (the provider itself, compromised, or a host
on its path) plays here: a real HTTP server on loopback that answers the
discovery document honestly and then drips the JWKS a byte at a time, or
sends one far larger than any key set. The hub's verifier fetches through its
real httpx client; a fetch that fails keeps the cached keys (none here), so
the token is refused with the reason, and nothing is held past the deadline
or read past the cap.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from switchboard.clock import SystemClock
from switchboard.config import Settings
from switchboard.errors import AuthError, ConfigError
from switchboard.hub.identity import oidc
from switchboard.hub.identity.oidc import OidcVerifier
from switchboard.testing.wait import scaled

pytestmark = pytest.mark.timeout(60)

HUGE = 64 << 20  # what the hostile JWKS would send in all: 64 times the cap


@dataclass
class Hostile:
    """How the JWKS answers: ``drip`` a byte per ``interval``, or ``huge`` bytes (declared or chunked)."""

    mode: str
    interval: float = 0.0
    sent: int = 0  # body bytes of the JWKS written to the hub
    port: int = 0

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for _ in range(4):  # discovery, then the JWKS, on one kept-alive connection
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                if path == b"/.well-known/openid-configuration":
                    body = json.dumps({"issuer": self.issuer, "jwks_uri": self.issuer + "/jwks"}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                    writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
                    await writer.drain()
                else:
                    await self.jwks(writer)
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()

    async def jwks(self, writer: asyncio.StreamWriter) -> None:
        if self.mode == "drip":
            body = b'{"keys": []}' + b" " * 40
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            for byte in body:
                writer.write(bytes((byte,)))
                await writer.drain()
                self.sent += 1
                await asyncio.sleep(self.interval)  # the attack itself: a byte per interval, each read in time
            return
        if self.mode == "declared":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b" " * (64 << 10)
        while self.sent < HUGE and not writer.is_closing():
            chunk = piece if self.mode == "declared" else b"%x\r\n%s\r\n" % (len(piece), piece)
            writer.write(chunk)
            await writer.drain()
            self.sent += len(piece)


async def serve(hostile: Hostile) -> AsyncIterator[Hostile]:
    server = await asyncio.start_server(hostile.handle, "127.0.0.1", 0)
    hostile.port = server.sockets[0].getsockname()[1]
    async with server:
        yield hostile


def verifier_of(hostile: Hostile) -> OidcVerifier:
    settings = Settings(oidc_issuer=hostile.issuer, oidc_audience="hub", oidc_allow_http=True)
    return OidcVerifier(settings, SystemClock())


def a_token() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return jwt.encode({"sub": "mallory", "exp": time.time() + 60}, key, algorithm="RS256", headers={"kid": "k1"})


@pytest.fixture
async def dripping() -> AsyncIterator[Hostile]:
    async for hostile in serve(Hostile("drip", interval=0.4)):
        yield hostile


async def test_a_jwks_dripped_a_byte_at_a_time_holds_the_fetch_no_longer_than_its_deadline(
    dripping: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(oidc, "FETCH_TIMEOUT", 1.0)  # each byte comes well within it: only a total deadline ends it
    verifier = verifier_of(dripping)

    started = time.monotonic()
    with pytest.raises(AuthError, match="could not be fetched"):
        await verifier.verify(a_token())
    took = time.monotonic() - started

    assert dripping.sent >= 2, "the provider never dripped"
    assert took < 1.0 + scaled(1.5), f"a fetch promised 1 s held the verification {took:.1f} s"


@pytest.mark.parametrize("mode", ["chunked", "declared"])
async def test_a_jwks_far_larger_than_any_key_set_is_not_read(mode: str) -> None:
    async for hostile in serve(Hostile(mode)):
        with pytest.raises(AuthError, match="could not be fetched"):
            await verifier_of(hostile).verify(a_token())
        # the hub stopped reading at the cap: what the server got out is the cap plus socket buffers
        assert hostile.sent < HUGE // 4, f"the hub read {hostile.sent >> 20} MiB of a hostile JWKS"
        assert oidc.MAX_FETCH_BYTES <= 1 << 20


def test_an_http_issuer_is_refused_unless_allowed_by_name() -> None:
    with pytest.raises(ConfigError, match="--oidc-allow-http/SWITCHBOARD_OIDC_ALLOW_HTTP"):
        Settings(oidc_issuer="http://login.example.org/", oidc_audience="hub")
    allowed = Settings.load(
        environ={
            "SWITCHBOARD_OIDC_ISSUER": "http://127.0.0.1:8080",
            "SWITCHBOARD_OIDC_AUDIENCE": "hub",
            "SWITCHBOARD_OIDC_ALLOW_HTTP": "true",
        }
    )
    assert allowed.oidc_issuer == "http://127.0.0.1:8080"
    assert Settings(oidc_issuer="https://login.example.org/", oidc_audience="hub").oidc_allow_http is False
