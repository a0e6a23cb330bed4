"""The connection hypha-rpc's ``RPC`` talks through, with Switchboard's reconnect policy under it.

``RPC`` needs a duck-typed connection: ``on_message``, ``on_connected``,
``on_disconnected``, ``emit_message``, ``disconnect``, ``manager_id``. This
one adds what the stock client lacks: several URLs tried in rotation, a
wall-clock budget (:class:`~switchboard.client.policy.Outage`) on an injected
clock, an immediate switch on a "going away" close, and fail-fast for calls
in flight when a connection drops.

States: ``CONNECTING`` (no socket) → ``REGISTERING`` (socket up; the RPC
re-registers services, hooks restore subscriptions) → ``READY``; any drop goes
back to ``CONNECTING``. ``FAILED`` (budget spent or a final refusal) and
``CLOSED`` (``disconnect()``) are terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from switchboard.client import wire
from switchboard.client.errors import ClientClosed, GaveUp, Refused, SocketClosed
from switchboard.client.events import (
    Disconnected,
    Event,
    GivingUp,
    Listeners,
    Reconnected,
    Reconnecting,
    Rejoined,
    describe,
)
from switchboard.client.policy import GOING_AWAY, Outage, ReconnectPolicy, Verdict, classify, rejoins
from switchboard.clock import Clock, SystemClock
from switchboard.errors import SwitchboardError

log = logging.getLogger(__name__)

# A connection that drops sooner than this after becoming ready resumes the
# outage it ended (same deadline, same backoff step), so a server that
# accepts and then drops clients cannot keep them in a tight loop forever:
# once a URL drops again soon after we came back to it, the next attempt
# backs off. A flap on a URL that had not dropped yet in the outage (a
# sibling we failed over to) moves on to the next URL at once.
FLAP_WINDOW = 5.0
# Seconds disconnect() waits for the hub to answer its close frame, and a failed handshake for
# the same: a hub that does not answer (stalled, cut off) costs at most this, and the socket is
# dropped then, whether the wait ran out or was cancelled.
CLOSE_WAIT = 5.0
HANDSHAKE_CLOSE_WAIT = 1.0


class State(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    REGISTERING = "registering"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


class Transport:
    """Reconnecting WebSocket transport for one client id (see the module docstring)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        client_id: str,
        workspace: str | None = None,
        token: str | None = None,
        reconnection_token: str | None = None,
        policy: ReconnectPolicy | None = None,
        clock: Clock | None = None,
        dial: wire.Dial | None = None,
        rng: random.Random | None = None,
        handshake_timeout: float = 30.0,
        ping_interval: float = 20.0,
        refresh_interval: float = 7200.0,
    ) -> None:
        if not urls:
            raise ValueError("at least one server URL is needed")
        self.urls = tuple(wire.normalize_url(u) for u in urls)
        self.client_id = client_id
        self._workspace = workspace
        self._token = token
        self._reconnection_token = reconnection_token
        self.policy = policy or ReconnectPolicy()
        self._clock = clock or SystemClock()
        self._dial = dial or wire.websocket_dial()
        self._rng = rng
        self._handshake_timeout = handshake_timeout
        self._ping_interval = ping_interval
        self._refresh_interval = refresh_interval
        self.manager_id: str | None = None
        self.connection_info: dict[str, Any] | None = None
        self.state = State.IDLE
        self.failure: SwitchboardError | None = None
        self.drops = 0  # established connections lost; a change fails calls in flight
        self._failed_sends = 0
        self._rejoining: str | None = None  # why the reconnection token was dropped, until joined again
        self._index = 0
        self._socket: wire.Socket | None = None
        self._changed = asyncio.Event()
        self._outage: Outage | None = None
        self._outage_urls: set[str] = set()  # the URLs that dropped during self._outage
        self._ready_at: float | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self.listeners = Listeners()
        self._ready_hooks: list[Callable[[], Awaitable[None]]] = []
        self._watched: set[asyncio.Future[Any]] = set()  # calls that fail if the connection drops
        self._on_message: Callable[[bytes], Any] | None = None
        self._on_connected: Callable[[dict[str, Any]], Awaitable[None]] | None = None
        self._on_disconnected: Callable[[str], None] | None = None

    # -- the interface hypha_rpc.RPC uses --------------------------------------------------------

    def on_message(self, handler: Callable[[bytes], Any]) -> None:
        self._on_message = handler

    def on_connected(self, handler: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Called on every *re*connection; the RPC registers itself after the first one."""
        self._on_connected = handler

    def on_disconnected(self, handler: Callable[[str], None]) -> None:
        """The RPC rejects its pending calls with ``ConnectionError("Connection lost: <reason>")``."""
        self._on_disconnected = handler

    # hypha_rpc.RPC reads these two names of its connection when it drops: while
    # the connection "reconnects" and is not "closed", it leaves its pending calls
    # alone (a provider's heartbeat to its caller among them, whose failure would
    # cancel the call it is running). The SDK fails the calls it makes itself
    # (watch(), calls.RemoteCall) and lets the hub deliver the rest once back.
    @property
    def _enable_reconnect(self) -> bool:
        return True

    @property
    def _closed(self) -> bool:
        return self.state in (State.FAILED, State.CLOSED)

    @property
    def workspace(self) -> str | None:
        return self.connection_info["workspace"] if self.connection_info else self._workspace

    async def emit_message(self, data: bytes) -> None:
        """Send now; during an outage wait for the next connection (bounded by the budget).

        A frame the socket refused without writing it (the stream had just
        ended, the reader has not seen it yet) waits for the next connection
        too: it never left, so sending it there cannot make it arrive twice.
        """
        while True:
            if self.state is State.CLOSED:
                raise ClientClosed(f"client {self.client_id} was disconnected")
            if self.state is State.FAILED:
                assert self.failure is not None
                raise self.failure
            sock = self._socket
            if sock is not None and self.state in (State.REGISTERING, State.READY):
                try:
                    await sock.send(data)
                    return
                except SocketClosed as exc:
                    if not exc.unsent:
                        self._failed_sends += 1
                        raise ConnectionError(f"could not send to {self.url}: {exc}") from exc
                if self._socket is not sock:
                    continue  # already replaced
            await self._wait_change()

    async def disconnect(self, reason: str | None = None) -> None:
        """Close for good (idempotent): no more reconnects, waiting senders get :class:`ClientClosed`."""
        if self.state is State.CLOSED:
            return
        self._set_state(State.CLOSED)
        sock, self._socket = self._socket, None
        self.listeners.cancel()
        for task in (self._supervisor, self._keepalive):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if sock is not None:
            await wire.close(sock, reason or "client disconnected", CLOSE_WAIT)
        current = asyncio.current_task()
        pending = [t for t in (self._supervisor, self._keepalive) if t is not None and t is not current]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        log.info(
            "client %s: disconnected (%s)",
            self.client_id,
            reason or "by the application",
            extra={"client_id": self.client_id},
        )

    # -- what the SDK adds ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.urls[self._index]

    @property
    def interruptions(self) -> int:
        """Drops plus sends that hit a dead socket: a call that saw this change was cut off."""
        return self.drops + self._failed_sends

    @property
    def clock(self) -> Clock:
        return self._clock

    def budget(self) -> Outage:
        """A fresh budget under this client's policy (``max_wait`` from its first failure)."""
        return Outage(self.policy, self._clock, self._rng)

    def watch(self, call: asyncio.Future[Any]) -> None:
        """Fail ``call`` with :class:`ConnectionError` if the connection drops before it is done."""
        if not call.done():
            self._watched.add(call)
            call.add_done_callback(self._watched.discard)

    def _interrupt(self, error: BaseException) -> None:
        for call in list(self._watched):
            if not call.done():
                call.set_exception(error)
        self._watched.clear()

    def add_ready_hook(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run ``hook`` after each reconnection's re-registration, before ``READY``."""
        self._ready_hooks.append(hook)

    async def wait_ready(self) -> None:
        """Until ``READY``; raises the failure or :class:`ClientClosed` if that cannot happen."""
        while self.state is not State.READY:
            if self.state is State.CLOSED:
                raise ClientClosed(f"client {self.client_id} was disconnected")
            if self.state is State.FAILED:
                assert self.failure is not None
                raise self.failure
            await self._wait_change()

    async def wait_closed(self) -> None:
        """Until ``disconnect()`` or a give-up."""
        while self.state not in (State.CLOSED, State.FAILED):
            await self._wait_change()

    async def open(self) -> dict[str, Any]:
        """First connection, retried within the budget like any outage; returns ``connection_info``."""
        if self.state is not State.IDLE:
            raise RuntimeError(f"transport already opened (state {self.state.value})")
        self._set_state(State.CONNECTING)
        outage = Outage(self.policy, self._clock, self._rng)
        try:
            sock = await self._connect(outage, start=0, wait_first=False, first_time=True)
        except (GaveUp, Refused) as exc:
            self._fail(exc)
            raise
        except BaseException:
            self._set_state(State.CLOSED)
            raise
        self._adopt(sock)
        self._mark_ready()
        log.info(
            "client %s: connected to %s (workspace %s)",
            self.client_id,
            self.url,
            self.workspace,
            extra={"client_id": self.client_id},
        )
        self._supervisor = asyncio.create_task(self._supervise(sock), name=f"sb-client {self.client_id}")
        assert self.connection_info is not None
        return self.connection_info

    # -- the reconnect loop ----------------------------------------------------------------------

    async def _supervise(self, sock: wire.Socket) -> None:
        """Owns the live socket; on a drop, reconnects until ready again or out of budget."""
        reader = self._start_reader(sock)
        try:
            while True:
                closed = await reader
                if self.state is State.CLOSED:
                    return
                outage, dropped_again = self._outage_after_drop(closed)
                self._dropped(closed)
                going_away = closed.code in GOING_AWAY
                # a fresh outage tries at once, and so does failover from a sibling that flapped;
                # a URL that flaps again backs off unless told to move
                wait_first = dropped_again and not going_away
                while True:
                    start = (self._index + 1) % len(self.urls)
                    sock = await self._connect(outage, start=start, wait_first=wait_first)
                    self._adopt(sock)
                    reader = self._start_reader(sock)
                    if await self._register(reader):
                        break
                    closed = reader.result()
                    outage.failed(closed)
                    self._dropped(closed)
                    wait_first = closed.code not in GOING_AWAY
                self._mark_ready()
                self._outage = outage
                self._announce(
                    Reconnected(
                        url=self.url,
                        attempts=outage.attempts,
                        outage_seconds=outage.elapsed,
                        remaining=outage.remaining,
                    )
                )
        except (GaveUp, Refused) as exc:
            self._fail(exc)
        except ClientClosed:
            pass
        except Exception as exc:  # a bug must not leave calls waiting for a reconnect that never comes
            log.exception("client %s: the reconnect loop failed", self.client_id)
            self._fail(SwitchboardError(f"client {self.client_id}: the reconnect loop failed: {exc!r}"))
        finally:
            if not reader.done():
                reader.cancel()

    def _outage_after_drop(self, closed: SocketClosed) -> tuple[Outage, bool]:
        """The outage this drop starts or resumes (a flap), and whether its URL dropped in it before."""
        lived = None if self._ready_at is None else self._clock.monotonic() - self._ready_at
        if self._outage is not None and lived is not None and lived < FLAP_WINDOW:
            if closed.code not in GOING_AWAY:
                self._outage.failed(closed)  # a flap counts against the budget
            dropped_again = self.url in self._outage_urls
            self._outage_urls.add(self.url)
            return self._outage, dropped_again
        self._outage = Outage(self.policy, self._clock, self._rng)
        self._outage_urls = {self.url}
        return self._outage, False

    async def _connect(self, outage: Outage, *, start: int, wait_first: bool, first_time: bool = False) -> wire.Socket:
        """Dial the URLs in rotation from ``start`` until one completes the handshake.

        No delay between URLs of one round (the first that answers wins); the
        policy's delay after each full round. Raises :class:`GaveUp` at the
        deadline, :class:`Refused` on a final refusal.
        """
        n = len(self.urls)
        index = start
        tried = 0
        delay = self._delay(outage) if wait_first else 0.0
        while True:
            url = self.urls[index]
            if not first_time or outage.attempts:
                self._announce(
                    Reconnecting(
                        attempt=outage.attempts + 1,
                        url=url,
                        delay=delay,
                        elapsed=outage.elapsed,
                        remaining=outage.remaining,
                        error=outage.last_error,
                    )
                )
            if delay > 0:
                await self._clock.sleep(delay)
            if self.state is State.CLOSED:
                raise ClientClosed(f"client {self.client_id} was disconnected")
            outage.attempt()
            try:
                sock = await self._attempt(url)
            except Exception as exc:
                if classify(exc) is Verdict.FATAL:
                    if isinstance(exc, Refused):
                        raise
                    raise Refused(f"{type(exc).__name__}: {exc}", url=url) from exc
                outage.failed(exc)
                index = (index + 1) % n
                tried += 1
                if tried % n:
                    if outage.remaining <= 0:
                        raise outage.gave_up(self.urls) from None
                    delay = 0.0
                else:
                    delay = self._delay(outage)
                continue
            self._index = index
            return sock

    def _delay(self, outage: Outage) -> float:
        delay = outage.next_delay()
        if delay is None:
            raise outage.gave_up(self.urls)
        return delay

    async def _attempt(self, url: str) -> wire.Socket:
        """One dial and handshake; on success the socket is open and ``connection_info`` stored.

        A hub that can no longer verify the reconnection token is dialled once
        more at once, joining as the same client id, in the same workspace,
        with the credential given (:func:`~switchboard.client.policy.rejoins`).
        """
        resumed = self._reconnection_token is not None
        try:
            sock = await self._handshake(url)
        except Refused as exc:
            if not rejoins(exc, resumed=resumed):
                raise
            log.info("client %s: %s; joining again", self.client_id, exc, extra={"client_id": self.client_id})
            self._reconnection_token = None
            self._rejoining = exc.reason
            sock = await self._handshake(url)
        if self._rejoining is not None:
            reason, self._rejoining = self._rejoining, None
            self._announce(Rejoined(url=url, client_id=self.client_id, workspace=str(self.workspace), reason=reason))
        return sock

    async def _handshake(self, url: str) -> wire.Socket:
        # joining again: the workspace of the last connection (an anonymous client named none)
        workspace = self.workspace if self._rejoining is not None else self._workspace
        sock = await self._dial(url)
        first = wire.hello(self.client_id, workspace, self._token, self._reconnection_token)
        try:
            info = await asyncio.wait_for(wire.handshake(sock, first, url, workspace), self._handshake_timeout)
        except BaseException:
            await wire.close(sock, "handshake failed", HANDSHAKE_CLOSE_WAIT)
            raise
        self.connection_info = info
        self.manager_id = info["manager_id"]
        self._reconnection_token = info.get("reconnection_token") or self._reconnection_token
        lifetime = info.get("reconnection_token_life_time")
        if isinstance(lifetime, int | float) and lifetime > 0:
            self._refresh_interval = min(self._refresh_interval, lifetime / 1.5)
        return sock

    async def _register(self, reader: asyncio.Task[SocketClosed]) -> bool:
        """Run the RPC's re-registration and our hooks; ``False`` if the socket died first."""
        self._set_state(State.REGISTERING)
        work = asyncio.create_task(self._run_connected())
        try:
            done, _ = await asyncio.wait({work, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
        return work in done and not work.cancelled()

    async def _run_connected(self) -> None:
        if self._on_connected is not None:
            try:
                await self._on_connected(dict(self.connection_info or {}))
            except Exception:
                if self.state is not State.CLOSED:
                    log.exception("client %s: re-registration after reconnecting failed", self.client_id)
        for hook in list(self._ready_hooks):
            try:
                await hook()
            except Exception:
                if self.state is not State.CLOSED:
                    log.exception("client %s: a reconnection hook failed", self.client_id)

    # -- one socket -----------------------------------------------------------------------------

    def _adopt(self, sock: wire.Socket) -> None:
        self._socket = sock
        self._keepalive = asyncio.create_task(
            wire.keep_alive(sock, self._clock, self._ping_interval, self._refresh_interval)
        )

    def _start_reader(self, sock: wire.Socket) -> asyncio.Task[SocketClosed]:
        return asyncio.create_task(self._read(sock))

    async def _read(self, sock: wire.Socket) -> SocketClosed:
        """Deliver frames until the socket ends; returns how it ended.

        A draining hub says "restarting" and then ends the stream without a
        close frame: that end counts as its close code (1012), not as a drop.
        """
        restarting: SocketClosed | None = None
        while True:
            try:
                frame = await sock.recv()
            except SocketClosed as closed:
                return restarting if restarting is not None and closed.code == 1006 else closed
            except Exception as exc:  # a broken socket is a closed socket
                return restarting or SocketClosed(1006, f"{type(exc).__name__}: {exc}")
            if isinstance(frame, str):
                restarting = self._control(frame) or restarting
                continue
            try:
                result = self._on_message(frame) if self._on_message else None
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("client %s: the RPC failed to handle a frame", self.client_id)

    def _control(self, text: str) -> SocketClosed | None:
        """Act on a text control frame; a "restarting" notice returns the close it stands for."""
        data = wire.control(text) or {}
        kind = data.get("type")
        if kind == "restarting":
            code = data.get("code")
            return SocketClosed(code if isinstance(code, int) else 1012, str(data.get("reason") or ""))
        if kind == "reconnection_token" and isinstance(data.get("reconnection_token"), str):
            self._reconnection_token = data["reconnection_token"]
        elif kind == "error":
            log.info("client %s: %s reports: %s", self.client_id, self.url, data.get("message"))
        elif kind != "pong" and log.isEnabledFor(logging.DEBUG):
            log.debug("client %s: ignored text frame %.200s", self.client_id, text)
        return None

    # -- state changes and their announcements ---------------------------------------------------

    def _set_state(self, state: State) -> None:
        self.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    def _mark_ready(self) -> None:
        self._ready_at = self._clock.monotonic()
        self._set_state(State.READY)

    def _dropped(self, closed: SocketClosed) -> None:
        url = self.url
        self._socket = None
        if self._keepalive is not None:
            self._keepalive.cancel()
        self.drops += 1
        self._set_state(State.CONNECTING)
        why = f"{url} closed the connection (code {closed.code}{': ' + closed.reason if closed.reason else ''})"
        self._announce(Disconnected(url=url, code=closed.code, reason=closed.reason))
        reason = f"{why}; calls in flight fail (only idempotent ones are retried)"
        self._interrupt(ConnectionError(f"Connection lost: {reason}"))
        self._notify_rpc(reason)

    def _fail(self, exc: SwitchboardError) -> None:
        self.failure = exc
        self._socket = None
        self._set_state(State.FAILED)
        self._announce(GivingUp(error=exc))
        self._interrupt(exc)
        self._notify_rpc(str(exc))

    def _notify_rpc(self, reason: str) -> None:
        if self._on_disconnected is not None:
            try:
                self._on_disconnected(reason)
            except Exception:
                log.exception("the RPC's disconnect handler failed")

    def _announce(self, event: Event) -> None:
        level = logging.WARNING if isinstance(event, GivingUp) else logging.INFO
        log.log(level, "client %s: %s", self.client_id, describe(event), extra={"client_id": self.client_id})
        self.listeners.dispatch(event)

    def __repr__(self) -> str:
        return (
            f"<Transport {self.client_id} {self.state.value} url={self.url} drops={self.drops} outage={self._outage!r}>"
        )
