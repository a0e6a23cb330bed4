"""What a call does when the connection drops under it: fail fast, or retry if idempotent.

A call in flight when the connection drops may or may not have run at the
provider, so by default it fails at once with :class:`CallInterrupted` (the
RPC would otherwise let it wait for its timeout). A function the provider
declared **idempotent** (running it twice does no harm) is instead retried
once the client is back. So is one the hub refused because its provider
is not connected ("Target peer ... is not connected": it left, or its grace
in transit ran out): retried on the reconnect policy's backoff until the
provider is back or the budget (``max_wait``) is spent, then the hub's error
is raised.

The declaration travels with the service, so every caller learns it from
``get_service``, whatever client the provider uses::

    await client.register_service({
        "id": "store",
        "config": {"visibility": "public", "idempotent": ["get", "meta.describe"]},
        "get": get, "put": put, "meta": {"describe": describe},
    })

or, with this SDK, mark the functions and let ``register_service`` fill the list::

    @idempotent
    async def get(key): ...
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from hypha_rpc.utils import ObjectProxy

from switchboard.client.errors import CallInterrupted, ClientClosed, GaveUp, Refused
from switchboard.client.transport import State, Transport

log = logging.getLogger("switchboard.client")

CONFIG_KEY = "idempotent"
_MARK = "__switchboard_idempotent__"

F = TypeVar("F", bound=Callable[..., Any])


def idempotent(fn: F) -> F:
    """Mark ``fn`` as safe to run twice; :meth:`Client.register_service` declares it."""
    setattr(fn, _MARK, True)
    return fn


def declare_idempotent(service: Any) -> Any:
    """A copy of ``service`` whose ``config.idempotent`` also lists its ``@idempotent`` functions."""
    if not isinstance(service, Mapping):
        return service  # e.g. a class instance: hypha-rpc converts it, declare by hand
    found = sorted(_marked(service, ""))
    service = dict(service)
    if not found:
        return service
    config = dict(service.get("config") or {})
    listed = list(config.get(CONFIG_KEY) or [])
    config[CONFIG_KEY] = listed + [name for name in found if name not in listed]
    service["config"] = config
    return service


def _marked(tree: Mapping[str, Any], prefix: str) -> Iterable[str]:
    for key, value in tree.items():
        if key == "config":
            continue
        if callable(value) and getattr(value, _MARK, False):
            yield prefix + key
        elif isinstance(value, Mapping):
            yield from _marked(value, f"{prefix}{key}.")


def declared(service: Mapping[str, Any]) -> frozenset[str]:
    """The function paths a service declares idempotent (``config.idempotent``)."""
    config = service.get("config") or {}
    names = config.get(CONFIG_KEY) if isinstance(config, Mapping) else None
    if not isinstance(names, list | tuple):
        return frozenset()
    return frozenset(n for n in names if isinstance(n, str))


class RemoteCall:
    """A remote function with Switchboard's semantics for connection loss.

    ``resolve`` returns the function to call, looked up at each call, so a
    manager method reaches the manager of the current connection.
    """

    def __init__(
        self, resolve: Callable[[], Callable[..., Any]], transport: Transport, *, name: str, idempotent: bool
    ) -> None:
        self._resolve = resolve
        self._transport = transport
        self.idempotent = idempotent
        fn = resolve()
        self.__name__ = getattr(fn, "__name__", name)
        self.__doc__ = getattr(fn, "__doc__", None)
        self._name = name
        # passing the function on to another service still passes the remote reference
        for attr in ("__rpc_object__", "_encoded_method", "__schema__"):
            if hasattr(fn, attr):
                setattr(self, attr, getattr(fn, attr))

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        transport = self._transport
        before = transport.interruptions
        try:
            return await self._call(args, kwargs)
        except Exception as exc:
            error = self._translate(exc, before)
            if error is None:
                if self.idempotent and not_connected(exc):
                    return await self._until_connected(exc, args, kwargs)
                raise
            if not (self.idempotent and isinstance(error, CallInterrupted)):
                if error is exc:
                    raise
                raise error from exc
        log.info("retrying idempotent %s once the connection is back", self._name)
        await transport.wait_ready()
        return await self._call(args, kwargs)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The remote call, failed at once if the connection drops before its answer comes."""
        pending = self._resolve()(*args, **kwargs)
        if isinstance(pending, asyncio.Future):
            self._transport.watch(pending)
        return pending

    async def _until_connected(self, first: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call again while the hub says the provider is not connected, on the policy's backoff."""
        transport = self._transport
        budget = transport.budget()
        budget.failed(first)
        while (delay := budget.next_delay()) is not None:
            log.info("retrying idempotent %s in %.2f s: %s", self._name, delay, budget.last_error)
            await transport.clock.sleep(delay)
            await transport.wait_ready()
            budget.attempt()
            before = transport.interruptions
            try:
                return await self._call(args, kwargs)
            except Exception as exc:
                error = self._translate(exc, before)
                if not (isinstance(error, CallInterrupted) or (error is None and not_connected(exc))):
                    if error is None or error is exc:
                        raise
                    raise error from exc
                budget.failed(exc)
        assert budget.last_error is not None
        raise budget.last_error

    def _translate(self, exc: Exception, before: int) -> Exception | None:
        """The SDK error for a failure caused by the connection, ``None`` for any other."""
        transport = self._transport
        if isinstance(exc, GaveUp | Refused | ClientClosed | CallInterrupted):
            return exc
        if transport.failure is not None:
            return transport.failure
        if transport.state is State.CLOSED:
            return ClientClosed(f"{self._name}: client {transport.client_id} was disconnected")
        connection_error = isinstance(exc, ConnectionError) or str(exc).startswith("Failed to send the request")
        if connection_error and transport.interruptions != before:
            why = "it is retried" if self.idempotent else "it is not retried: not declared idempotent"
            return CallInterrupted(f"{self._name}: the connection dropped while the call was in flight; {why} ({exc})")
        return None

    def __repr__(self) -> str:
        return f"<RemoteCall {self._name}{' idempotent' if self.idempotent else ''}>"


def not_connected(exc: BaseException) -> bool:
    """The hub's refusal of a call whose target has no connection (protocol §3.5)."""
    return "is not connected" in str(exc)


def wrap_service(service: Any, transport: Transport) -> Any:
    """The service with each function wrapped in :class:`RemoteCall` (idempotent as declared)."""
    names = declared(service)
    proxy_type = type(service) if isinstance(service, ObjectProxy) else ObjectProxy
    service_id = service.get("id", "service") if isinstance(service, Mapping) else "service"
    return proxy_type.fromDict(_wrap(service, "", names, transport, str(service_id)))


def _wrap(
    tree: Mapping[str, Any], prefix: str, names: frozenset[str], transport: Transport, sid: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in dict.keys(tree) if isinstance(tree, dict) else tree:
        value = dict.__getitem__(tree, key) if isinstance(tree, dict) else tree[key]
        path = prefix + str(key)
        if key == "config" or not (callable(value) or isinstance(value, Mapping)):
            out[key] = value
        elif callable(value):
            out[key] = RemoteCall(lambda fn=value: fn, transport, name=f"{sid}.{path}", idempotent=path in names)
        else:
            out[key] = _wrap(value, path + ".", names, transport, sid)
    return out
