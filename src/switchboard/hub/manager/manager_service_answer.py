"""The manager's answer to ``get_service("default")``, encoded once and sent to every caller.

Every hypha-rpc client asks for the manager's ``default`` service twice while
it connects (``services.built-in.get_service``, the RPC's own built-in
method). The RPC answers by encoding the whole service, 31 functions with
their docs and schemas (about 14 KB), for each call: the largest share of
a connect's hub CPU after the plain calls. The answer is the same for every
caller: the service is registered once, ``public``, and its functions are
addresses of the manager (``*/<manager id>``), not of the caller; what a
caller may do with them is checked when it calls them, on its own rights.

So the first answer the RPC sends is kept (its payload bytes, exactly as the
RPC encoded them) and later calls get the same bytes under their own header.
Only the plain form of the call is answered so (the service id ``default``
alone, no keyword arguments, no encryption); anything else
goes to the RPC as before. Pure: no I/O, the door sends what this returns.
"""

from __future__ import annotations

from typing import Any

import msgpack

from switchboard.errors import ProtocolError
from switchboard.protocol.hypha import envelope

METHOD = "services.built-in.get_service"
# get_service("default") calls handed to the RPC before its first answer came; a few are enough
# (the first answer fills the cache), and a bound keeps a flood of them from growing the set.
MAX_WATCHED = 16


class ManagerServiceAnswer:
    """The encoded answer, once the RPC has given it (see the module docstring)."""

    def __init__(self) -> None:
        self.payload: bytes | None = None  # {"args": [<the encoded service>]}, as the RPC packed it
        self._watched: set[str] = set()  # sessions whose answer from the RPC is to be kept

    @staticmethod
    def resolver(env: envelope.Envelope, extra: dict[str, Any]) -> str | None:
        """The method that resolves a plain ``get_service("default")`` call (None: not one).

        The promise is hypha-rpc's ``"*"`` or its explicit form, whose targets the door has
        checked are the caller's own.
        """
        if (
            env.main.get("method") != METHOD
            or extra.get("args") != ["default"]
            or extra.get("with_kwargs")
            or "_enc" in extra
            or "_enc" in env.main
            or not env.session
        ):
            return None
        promise = extra.get("promise")
        if promise == "*":
            return f"{env.session}.resolve"
        resolve = promise.get("resolve") if isinstance(promise, dict) else None
        method = resolve.get("_rmethod") if isinstance(resolve, dict) else None
        return method if isinstance(method, str) and method.endswith(".resolve") else None

    def answer(self, resolve: str, session: str, caller: str) -> bytes | None:
        """The frame that resolves ``caller``'s call (None: not kept yet: the RPC is to answer,
        and its answer to this call will be kept)."""
        if self.payload is None:
            if len(self._watched) >= MAX_WATCHED:  # calls whose answers never came
                self._watched.clear()
            self._watched.add(resolve)
            return None
        main = {"type": "method", "to": caller, "method": resolve, "parent": session}
        return envelope.encode(main, self.payload)

    def saw(self, frame: bytes) -> None:
        """A frame the RPC sent: keep it if it answers a watched call with the service."""
        if not self._watched:
            return
        try:
            env = envelope.decode(frame)
        except ProtocolError:
            return
        method = env.main.get("method")
        if method not in self._watched:
            return
        self._watched.discard(method)
        if self.payload is not None:
            return
        rest = bytes(env.rest)
        try:
            answer = msgpack.unpackb(rest, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException):
            return
        args = answer.get("args") if isinstance(answer, dict) else None
        if (
            isinstance(answer, dict)
            and list(answer) == ["args"]
            and isinstance(args, list)
            and len(args) == 1
            and _is_manager(args[0])
        ):
            self.payload = rest

    def forget(self) -> None:
        """The RPC was started again: what it encodes is to be read again."""
        self.payload = None
        self._watched.clear()


def _is_manager(service: Any) -> bool:
    return isinstance(service, dict) and service.get("id") == "default" and service.get("type") == "generic"
