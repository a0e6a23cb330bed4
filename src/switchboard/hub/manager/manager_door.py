"""What reaches the manager's RPC, and on whose behalf.

The manager is a hypha-rpc peer inside the hub that acts with the root user,
so it must act for nobody but the client that called it:

* **The caller is the connection.** The hub hands each frame in with the
  :class:`~switchboard.hub.sessions.peer.Peer` that sent it and the door puts it in
  :data:`CALLER` for the manager's methods (the tasks the RPC starts for a
  frame inherit it). Nothing the message says about its sender counts.
* **The manager answers only its caller.** A call's promise names where the
  result goes (``resolve``, ``reject``, ``heartbeat``); the RPC calls those
  functions as itself. A promise that names anyone but the sender would make
  the manager call a third client's protected functions, so it is refused.
* **Chunked messages are put together here.** A message too large for one
  frame arrives as ``message_cache`` calls; hypha-rpc would keep their
  pieces in one store shared by every sender, unbounded. The door keeps them
  per sender in :class:`~switchboard.hub.routing.uploads.Uploads`, bounded and freed
  when the sender leaves, answers those calls itself, and hands the whole
  message to the RPC as one frame that passes every check above.
* **Plain calls skip the RPC.** The calls every client makes while it
  connects (``register_service`` of its built-in service, ``subscribe``)
  carry plain data and return plain data. The RPC would turn their
  arguments into proxy objects that the manager turns straight back into
  plain data, and spin up its callback machinery for the answer: about a
  third of the hub's CPU for a connect. The door runs them itself (the
  same method, as the same caller, after the same checks) and answers
  with the ``resolve`` or ``reject`` the RPC would have sent. Anything
  else (keyword arguments, encoded objects, encryption, an explicit
  promise) goes to the RPC as before.
* **A silent Redis is not waited for.** The manager's work for a frame (and
  every task it starts) runs within :func:`~switchboard.backends.patience.patience`:
  a lookup, a listing, a registration fails with a retryable error once Redis
  has answered nobody for 0.75 s, instead of holding the client for the
  whole command timeout.
* **Calls decided without I/O are answered in order.** ``subscribe`` and
  ``unsubscribe`` (``immediate_calls``) are run and answered before the
  client's next frame is read, so a client's calls are answered in the
  order they came, as Hypha answers them: hypha-rpc subscribes to
  ``client_disconnected`` and asks for the manager's service right after,
  as it connects; in a task, the subscribe was answered after the service.
* **The manager's service is encoded once.** ``get_service("default")``,
  asked twice by every connecting client, is answered with the bytes of
  the RPC's first answer (:mod:`switchboard.hub.manager.manager_service_answer`).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any

import msgpack

from switchboard.backends.patience import patience
from switchboard.errors import LimitExceeded, PermissionDenied, ProtocolError
from switchboard.hub.identity.users import Permission
from switchboard.hub.manager.manager_service_answer import ManagerServiceAnswer
from switchboard.hub.routing.uploads import Uploads
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.chunks import cache_op, parse_cache_call
from switchboard.protocol.hypha.payload import check_promise, payload_map
from switchboard.tasks import spawn

log = logging.getLogger(__name__)

# The local client whose frame the manager is handling (None: a reply from a
# provider, or the manager's own traffic; the manager's services refuse those).
CALLER: ContextVar[Peer | None] = ContextVar("switchboard_manager_caller", default=None)

_REFUSED = (ProtocolError, PermissionDenied, LimitExceeded)


def calling_peer() -> Peer:
    """The connection whose frame the manager is handling; never who the message says it is from."""
    peer = CALLER.get()
    if peer is None or peer.closed:
        raise PermissionDenied("Permission denied: the manager serves only calls of connected clients")
    return peer


def require(peer: Peer, workspace: str, need: Permission) -> None:
    """Refuse unless ``peer``'s user holds ``need`` in ``workspace``."""
    if not peer.user.can(workspace, need):
        raise PermissionDenied(f"Permission denied for workspace {workspace}")


class ManagerDoor:
    """Checks and carries frames into the manager's RPC (see the module docstring)."""

    def __init__(
        self,
        *,
        handler: Callable[[], Callable[[bytes | dict[str, Any]], None] | None],
        send: Callable[[bytes], object],
        uploads: Uploads,
        plain_calls: Mapping[str, Callable[..., Awaitable[Any]]] | None = None,
        immediate_calls: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        self._handler = handler  # the RPC's message handler, once it runs
        self._send = send  # a frame from the manager to a client, stamped and routed
        self.uploads = uploads
        self._plain_calls = dict(plain_calls or {})  # method id -> the manager's function
        self._immediate_calls = dict(immediate_calls or {})  # method id -> a function decided without I/O
        self.calls: set[asyncio.Task[Any]] = set()  # plain calls running
        self.service_answer = ManagerServiceAnswer()  # get_service("default"), encoded once

    def receive(self, frame: bytes, caller: Peer | None = None, env: envelope.Envelope | None = None) -> None:
        """Hand a frame addressed to the manager to its RPC, if it may go there. ``env``: ``frame``
        decoded already (the router's, as it stamped it), so that it is not decoded twice."""
        handler = self._handler()
        if handler is None:
            return
        try:
            if env is None:
                env = envelope.decode(frame)
            extra = payload_map(env.rest)
        except ProtocolError as exc:
            log.info("manager dropped a frame: %s", exc)
            return
        sender = str(env.main.get("from", ""))
        op = cache_op(env.main.get("method"))
        message: bytes | dict[str, Any] = frame
        try:
            if op is not None:
                whole = self._cache_call(env, extra, op, sender)
                if whole is None:
                    return
                message = whole
                extra = whole
            check_promise(extra.get("promise"), sender)
        except _REFUSED as exc:
            log.info("refused a frame from %s to the manager: %s", sender, exc)
            self._answer(env, sender, error=str(exc))
            return
        resolve = ManagerServiceAnswer.resolver(env, extra) if op is None and caller is not None else None
        if resolve is not None:
            answer = self.service_answer.answer(resolve, str(env.session), sender)
            if answer is not None:
                if "/" in sender:
                    self._send(answer)
                return
        # a client's request waits for a silent Redis only briefly (the tasks started for it as well)
        with patience():
            if op is None and self._call_plain(env, extra, sender, caller):
                return
            token = CALLER.set(caller)
            try:
                handler(message)
            except Exception as exc:  # a bad frame must not take the router down
                log.info("manager dropped a frame it could not process: %s: %.200s", type(exc).__name__, exc)
            finally:
                CALLER.reset(token)

    def _call_plain(self, env: envelope.Envelope, extra: dict[str, Any], sender: str, caller: Peer | None) -> bool:
        """Run a plain call (see the module docstring) as a task; False: it is the RPC's to handle."""
        method = env.main.get("method")
        immediate = self._immediate_calls.get(method)  # type: ignore[arg-type]
        function = immediate or self._plain_calls.get(method)  # type: ignore[arg-type]
        if function is None or caller is None or extra.get("with_kwargs") or "_enc" in extra or "_enc" in env.main:
            return False
        promise = extra.get("promise")
        args = extra.get("args", [])
        if promise not in (None, "*") or type(args) is not list or b"_rtype" in bytes(env.rest):
            return False  # an explicit promise, or encoded objects among the arguments
        session = env.session if promise == "*" else None
        token = CALLER.set(caller)  # the call (or the task) starts with the caller as its context
        try:
            if immediate is not None:
                self._answer_plain(lambda: immediate(*args), sender, session)
            else:
                spawn(self.calls, self._run_plain(function, args, sender, session))
        finally:
            CALLER.reset(token)
        return True

    def _answer_plain(self, call: Callable[[], Any], sender: str, session: str | None) -> None:
        """Run an immediate call now and send its answer (see the module docstring)."""
        try:
            value = call()
            answer = self._resolve(session, sender, value) if session else None
        except Exception as exc:
            answer = self._rejection(exc, sender, session)
        if answer is not None and "/" in sender:
            self._send(answer)

    async def _run_plain(
        self, function: Callable[..., Awaitable[Any]], args: list[Any], sender: str, session: str | None
    ) -> None:
        try:
            value = await function(*args)  # run even when no answer is wanted (no promise)
            answer = self._resolve(session, sender, value) if session else None
        except Exception as exc:
            answer = self._rejection(exc, sender, session)
        if answer is not None and "/" in sender:
            self._send(answer)

    @staticmethod
    def _rejection(exc: Exception, sender: str, session: str | None) -> bytes | None:
        """The caller's to see, as the RPC would reject it (named, without the stack)."""
        if not session:
            return None
        trace = "".join(traceback.format_exception_only(type(exc), exc))
        return envelope.reject_frame(session=session, target="", caller=sender, message=str(exc), trace=trace)

    def forget(self, sender: str) -> None:
        """A client left: the pieces of its unfinished messages go."""
        self.uploads.forget(sender)

    def _cache_call(self, env: envelope.Envelope, extra: dict[str, Any], op: str, sender: str) -> dict[str, Any] | None:
        """Do one ``message_cache`` call; once ``process`` completes a message, return it.

        The whole message goes to the RPC already decoded, as hypha-rpc reads
        one (header, stamped with the ``process`` call's identity, then the
        checked payload over it): a frame of megabytes would overflow the
        RPC's buffer for single frames.
        """
        call = parse_cache_call(op, extra)
        whole = None
        done = self.uploads.take(sender, call)
        if call.op == "process":
            assembled = envelope.decode(done or b"")
            main = env.main  # the process call's header, as the hub stamped it
            who = envelope.identity(main["from"], main.get("ws", ""), main.get("user") or {})
            envelope.stamp(assembled, identity=who, to=main["to"])
            whole = dict(assembled.main)
            whole["ctx"] = dict(assembled.main)
            whole.update(payload_map(assembled.rest))
        self._answer(env, sender)
        return whole

    def _answer(self, env: envelope.Envelope, sender: str, *, error: str | None = None) -> None:
        """Resolve (or reject, with ``error``) the call ``env`` made, if it waits for an answer."""
        session = env.session
        if not session or "/" not in sender:
            return
        if error is None:
            self._send(self._resolve(session, sender, None))
            return
        self._send(envelope.reject_frame(session=session, target="", caller=sender, message=error))

    @staticmethod
    def _resolve(session: str, sender: str, value: Any) -> bytes:
        """The ``<session>.resolve`` call that answers ``sender``'s call with ``value`` (plain data)."""
        return envelope.encode(
            {"type": "method", "to": sender, "method": f"{session}.resolve"},
            msgpack.packb({"args": [value]}, use_bin_type=True),
        )
