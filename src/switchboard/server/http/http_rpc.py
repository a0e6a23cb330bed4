"""``GET /rpc`` and ``POST /rpc``: the hypha-rpc HTTP streaming transport (protocol §8.4).

Downstream, a GET response is one peer's pipe: frames of big-endian ``uint32``
length + msgpack. RPC frames pass through as routed; the hub's JSON control
frames (pong, reconnection token, error) become msgpack maps, the only thing
the client parses here. An idle stream gets ``{"type": "ping"}`` (the client
skips it) well within the client's read timeout, its ``method_timeout`` (30 s
by default). The peer lives as long as the response; a new GET for the same
``workspace/client_id`` (with its reconnection token) supersedes it. A client
that stops reading fills its bounded send queue and is closed as a slow
consumer (1008, as on a WebSocket); if its stream is still stuck a grace later,
it is detached and its connection reset rather than closed (``_drop_connection``).

Who may POST for a peer. The client sends the same credentials on every POST:
its user token as ``Authorization: Bearer`` (nothing when anonymous), never its
reconnection token; the client id and workspace in the query are public (they
are in every service id). So the GET response sets a per-stream secret cookie
(``sb_rpc_<hash of peer id>``, HttpOnly, SameSite=Strict, default path so a
path-prefixing proxy keeps working), which the client's httpx session returns
on each POST; each GET rotates it. A POST is accepted with the current secret
of that peer's stream, unless a browser sent it from a page of another origin
(SameSite stops other sites, not other ports or subdomains of this one:
:mod:`~switchboard.server.http.fetch_origin`), or else with a bearer token that
verifies as the peer's own user (same client id if the token is bound to
one, read access to the workspace): its holder could open a stream as that
user anyway. Otherwise 401
(bad token) or 403. A client without a cookie jar (Node's fetch, a browser
posting cross-origin: the hub allows no credentials across origins) thus needs
a token, and the 403 says so (:data:`REMEDY`). A stream opened cross-origin
without a token could never post, so it is refused when it opens, with the
same remedy; hypha-rpc's JavaScript client logs the detail and retries.
A POST for a peer with no HTTP stream on this replica gets 400, which the
client retries (a balancer may have misrouted it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import secrets
import struct

import msgpack
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from switchboard.clock import Clock
from switchboard.errors import AuthError, BackendError, HandshakeError, ProtocolError, RequestRefused
from switchboard.hub.hub import Hub
from switchboard.hub.identity.users import Permission
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import envelope, handshake, ids
from switchboard.server.common.connection_reset import reset
from switchboard.server.common.session import ClientSession
from switchboard.server.http import fetch_origin
from switchboard.server.http.http_errors import refusal, status_of
from switchboard.server.process.server_state import ServerState

log = logging.getLogger(__name__)

KEEPALIVE_INTERVAL = 15.0  # half the client's default read timeout (method_timeout=30)
STREAM_TYPE = "application/x-msgpack-stream"
_LENGTH = struct.Struct(">I")
_PING = json.dumps({"type": "ping"})
_CONTROL = ("ping", "refresh_token")
_WRITER_GRACE = 5.0  # seconds a closing stream may spend flushing to a slow reader
REMEDY = (
    "A client that keeps no cookies (Node's fetch, a web page on another origin) must connect with a "
    "token (Authorization: Bearer, e.g. one from generate_token()) or use the WebSocket transport; "
    "see the README, 'HTTP streaming without cookies'."
)


def routes(*, keepalive_interval: float = KEEPALIVE_INTERVAL) -> list[Route]:
    """``/rpc``, and ``/{workspace}/rpc`` as hypha-rpc's JavaScript client used until 0.21.3x.

    That older form names the workspace in the path (``public`` when the client
    has none yet: the hub then picks, as for no workspace); a ``workspace``
    query parameter still wins.
    """
    stream = functools.partial(open_stream, keepalive=keepalive_interval)
    return [
        Route("/rpc", stream, methods=["GET"]),
        Route("/rpc", post_message, methods=["POST"]),
        Route("/{workspace}/rpc", stream, methods=["GET"]),
        Route("/{workspace}/rpc", post_message, methods=["POST"]),
    ]


def _query(request: Request, name: str) -> str | None:
    """A query parameter; for ``workspace`` also the path's (``public`` = not chosen yet, on GET)."""
    value = request.query_params.get(name)
    if value or name != "workspace":
        return value
    path = request.path_params.get("workspace")
    if path == "public" and request.method == "GET":
        return None
    return path


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def _stream_of(peer: Peer) -> StreamTransport:
    """The transport of a peer this module attached: always a :class:`StreamTransport`."""
    transport = peer.transport
    if not isinstance(transport, StreamTransport):
        raise TypeError(f"{peer.id} is not the peer of an HTTP stream")
    return transport


def cookie_name(peer_id: str) -> str:
    """Per-peer name: clients sharing one cookie jar (a browser) keep apart."""
    return "sb_rpc_" + hashlib.sha256(peer_id.encode()).hexdigest()[:16]


class StreamTransport:
    """A peer's downstream written as length-prefixed msgpack frames into a response body."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._send: Send | None = None
        self.session = secrets.token_urlsafe(32)
        self.last_sent = clock.monotonic()
        self.broken = False

    def bind(self, send: Send) -> None:
        self._send = send

    def try_send(self, frame: bytes | str) -> bool:
        """Always ``False``: ASGI can only write a response body by awaiting."""
        return False

    async def send_bytes(self, data: bytes) -> None:
        await self.send_frame(data)

    async def send_text(self, text: str) -> None:
        """The hub's JSON control frames become msgpack maps: the client parses nothing else."""
        try:
            message = json.loads(text)
        except ValueError:
            log.warning("dropped a non-JSON text frame (%d chars)", len(text))
            return
        await self.send_frame(msgpack.packb(message))

    async def close(self, code: int, reason: str) -> None:
        """Say why on abnormal closes, unless the pipe is stuck; the response ends the body."""
        if code != 1000 and reason and not self.broken:
            await self.send_text(handshake.error_text(reason))

    async def send_frame(self, data: bytes) -> None:
        assert self._send is not None, "transport used before the response started"
        body = _LENGTH.pack(len(data)) + data
        try:
            await self._send({"type": "http.response.body", "body": body, "more_body": True})
        except BaseException:  # e.g. cancelled, blocked on a reader that stopped: never retry
            self.broken = True
            raise
        self.last_sent = self._clock.monotonic()

    async def end(self) -> bool:
        """End the body; ``False`` if the reader is stuck: the connection must be dropped instead."""
        if self._send is None or self.broken:
            return False
        try:
            last = {"type": "http.response.body", "body": b""}
            await asyncio.wait_for(self._send(last), _WRITER_GRACE)
        except Exception:  # includes the timeout
            self.broken = True
            return False
        return True


# -- GET: the downstream ----------------------------------------------------


async def open_stream(request: Request, *, keepalive: float) -> Response:
    state: ServerState = request.app.state.switchboard
    hub = state.hub
    if request.method != "GET":
        return refusal(405, "GET /rpc opens a stream; use GET")
    if not state.accepting:
        return refusal(503, "Server is not accepting connections, retry later")
    if _bearer(request) is None and _cross_origin(request, hub.settings.public_base_url):
        hub.metrics.handshake_failures.inc()
        detail = (
            "Permission denied: an anonymous HTTP stream opened from another origin cannot send: "
            "the browser returns no cookie across origins and the client sends no token. " + REMEDY
        )
        log.info("stream refused (403): cross-origin without a token", extra={"replica": hub.replica_id})
        return refusal(403, detail)
    fields = {k: _query(request, k) for k in ("client_id", "workspace", "reconnection_token")}
    try:
        hello = handshake.parse_hello(json.dumps({**fields, "token": _bearer(request)}))
    except HandshakeError as exc:
        return _refused(hub, RequestRefused(400, str(exc)))
    return DownstreamResponse(request, state, hello, keepalive=keepalive)


def _refused(hub: Hub, exc: RequestRefused | BackendError) -> Response:
    hub.metrics.handshake_failures.inc()
    status, detail = status_of(exc)
    log.info("stream refused (%d): %s", status, detail, extra={"replica": hub.replica_id})
    return refusal(status, detail)


def _cross_origin(request: Request, public_base_url: str) -> bool:
    """Whether a browser sent this from a page of another origin (which gets no cookie back).

    Browsers name the page's origin on cross-origin requests (``null`` for
    sandboxed or file pages); a same-origin GET carries none. Own origins: the
    one the request was addressed to and the public URL (behind a proxy).
    """
    origin = request.headers.get("origin")
    if origin is None:
        return False
    own = {f"{request.url.scheme}://{request.headers.get('host', '')}", public_base_url.rstrip("/")}
    return origin.rstrip("/") not in own


def _refusal_of(exc: HandshakeError | BackendError, *, admitted: bool) -> RequestRefused | BackendError:
    """What ``http_errors`` answers a refused stream with: 401 or 403 from the admission, 409
    from the attach (the id is live elsewhere), 503 for a backend out of reach (retried)."""
    if isinstance(exc, BackendError):
        return exc
    if admitted:
        return RequestRefused(409, str(exc))
    return RequestRefused(401 if exc.close_code == handshake.CLOSE_POLICY else 403, str(exc))


class DownstreamResponse(Response):
    """Admits and attaches the caller as one peer, streams to it until either side closes, then
    detaches it (:class:`~switchboard.server.common.session.ClientSession`); a refusal is an HTTP status."""

    def __init__(self, request: Request, state: ServerState, hello: handshake.Hello, *, keepalive: float) -> None:
        self.state, self.hello, self.keepalive = state, hello, keepalive
        self.status_code = 200
        self.secure = request.url.scheme == "https"
        self.root_cookie = "workspace" in request.path_params  # /{workspace}/rpc: the POSTs go to another "directory"

    def _stream_headers(self, peer: Peer, transport: StreamTransport) -> list[tuple[bytes, bytes]]:
        cookie = f"{cookie_name(peer.id)}={transport.session}; HttpOnly; SameSite=Strict"
        if self.root_cookie:
            cookie += "; Path=/"
        if self.secure:
            cookie += "; Secure"
        return [
            (b"content-type", STREAM_TYPE.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # nginx: pass frames on as they come
            (b"set-cookie", cookie.encode("latin-1")),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hub = self.state.hub
        transport = StreamTransport(hub.clock)
        session = ClientSession(self.state, self.hello, transport)
        del self.hello  # the token in it is not kept for the stream's life
        try:
            async with session:
                peer = session.peer
                await send(
                    {"type": "http.response.start", "status": 200, "headers": self._stream_headers(peer, transport)}
                )
                transport.bind(send)
                await transport.send_frame(msgpack.packb(session.info))
                session.info = None
                await _pump(peer, receive, hub.clock, self.keepalive)
        except (HandshakeError, BackendError) as exc:
            if session.attached:
                raise  # not a refusal: the stream's own failure
            await _refused(hub, _refusal_of(exc, admitted=session.admitted))(scope, receive, send)
            return
        if not await transport.end():
            await _drop_connection(peer, receive)


async def _drop_connection(peer: Peer, receive: Receive) -> None:
    """Reset the connection of a stream whose reader is stuck (see :mod:`switchboard.server.common.connection_reset`)."""
    if not reset():  # the transport of this request's connection
        return
    peer.log.warning("stream not read for %gs after %r: dropping the connection", _WRITER_GRACE, peer.close_reason)
    # let the server see the connection go before the app returns, or it
    # reports a response "returned without completing" and closes it again
    with contextlib.suppress(Exception):  # includes the timeout
        async with asyncio.timeout(1.0):
            while (await receive())["type"] != "http.disconnect":
                pass


async def _pump(peer: Peer, receive: Receive, clock: Clock, keepalive: float) -> None:
    """Writer, keepalive and disconnect watch, all owned here, until the peer closes."""
    async with asyncio.TaskGroup() as tg:
        writer = tg.create_task(_write(peer), name=f"writer {peer.id}")
        helpers = [
            tg.create_task(_keepalive(peer, clock, keepalive), name=f"keepalive {peer.id}"),
            tg.create_task(_watch_disconnect(peer, receive), name=f"watch {peer.id}"),
        ]
        await peer.wait_closed()
        for task in helpers:
            task.cancel()
        done, _ = await asyncio.wait({writer}, timeout=_WRITER_GRACE)
        if not done:
            writer.cancel()


async def _write(peer: Peer) -> None:
    try:
        await peer.run_writer()
    except Exception:  # a broken pipe ends this peer, not the server
        peer.log.warning("stream write failed", exc_info=True)
        peer.close(1011, "stream write failed")


async def _keepalive(peer: Peer, clock: Clock, interval: float) -> None:
    """Ping only an idle stream: every frame sent moves the deadline."""
    transport = _stream_of(peer)
    while not peer.closed:
        idle = clock.monotonic() - transport.last_sent
        if idle >= interval:
            peer.send(_PING)
            idle = 0.0
        await clock.sleep(interval - idle)


async def _watch_disconnect(peer: Peer, receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    peer.client_closed(1000)  # a stream that ends is a goodbye: it has no close code to say otherwise


# -- POST: the upstream -----------------------------------------------------


async def post_message(request: Request) -> Response:
    hub = request.app.state.switchboard.hub
    limit = hub.settings.max_message_bytes
    try:
        workspace, client_id = _param(request, "workspace"), _param(request, "client_id")
        _check_declared_size(request, limit)
        peer = _stream_peer(hub, f"{workspace}/{client_id}")
        await _authorize(request, hub, peer)
        body = await _read_body(request, limit)
        await _dispatch(hub, peer, body)
    except (RequestRefused, AuthError) as exc:
        status, detail = status_of(exc)
        log.info("POST /rpc refused (%d): %s", status, detail, extra={"replica": hub.replica_id})
        return refusal(status, detail)
    return Response(status_code=200)


def _param(request: Request, name: str) -> str:
    """A required id of the query, in the id grammar (it names a peer): else 400."""
    value = _query(request, name)
    if not value:
        raise RequestRefused(400, f"Query parameter {name!r} is required")
    if not ids.is_id(value):
        raise RequestRefused(400, f"invalid {name.replace('_', ' ')} {value[:64]!r}: use {ids.GRAMMAR}")
    return value


def _check_declared_size(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestRefused(413, f"Message of {declared} bytes exceeds the limit of {limit} bytes")


def _stream_peer(hub: Hub, peer_id: str) -> Peer:
    peer = hub.peers.get(peer_id)
    if peer is None or not isinstance(peer.transport, StreamTransport) or peer.closed:
        raise RequestRefused(400, f"No open HTTP stream for client {peer_id} here: open GET /rpc first")
    return peer


async def _authorize(request: Request, hub: Hub, peer: Peer) -> None:
    """The stream's cookie from the hub's own origin, or the peer's own user's token (see the module docstring)."""
    transport = _stream_of(peer)
    presented = request.cookies.get(cookie_name(peer.id), "")
    token = _bearer(request)
    if presented and hmac.compare_digest(presented.encode(), transport.session.encode()):
        own = fetch_origin.own_origins(
            request.url.scheme, request.headers.get("host", ""), hub.settings.public_base_url
        )
        foreign = fetch_origin.foreign_page(request.headers, own)
        if foreign is None:
            return
        if token is None:
            raise RequestRefused(
                403,
                f"Permission denied: a POST from another origin ({foreign}) may not use the cookie of the stream "
                f"of {peer.id}: only the hub's own pages may. A page elsewhere must send a token "
                "(Authorization: Bearer).",
            )
    if token is None:
        raise RequestRefused(
            403,
            f"Permission denied: not the owner of the stream of {peer.id}: a POST must carry that stream's "
            f"cookie or a token of its user. {REMEDY}",
        )
    user = await hub.http.verify(token)  # AuthError: 401
    user = await hub.http.as_owner(user, peer.workspace)  # an owner reads it, as at its admission
    same_client = user.client_id in (None, peer.client_id)
    if user.id != peer.user.id or not same_client or not user.can(peer.workspace, Permission.READ):
        raise RequestRefused(403, f"Permission denied: this token cannot send as {peer.id}")


async def _read_body(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestRefused(413, f"Message exceeds the limit of {limit} bytes")
    return bytes(body)


async def _dispatch(hub: Hub, peer: Peer, body: bytes) -> None:
    """A control map is answered down the stream; anything else is routed as an RPC frame."""
    try:
        env = envelope.decode(body)
    except ProtocolError as exc:
        raise RequestRefused(400, f"Invalid message: {exc}") from None
    if env.type in _CONTROL and "to" not in env.main and not len(env.rest):
        hub.handle_text(peer, json.dumps({"type": env.type}))
    else:
        await hub.handle_binary(peer, body)
