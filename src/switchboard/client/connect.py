"""``connect()``: a hypha-rpc ``RPC`` on Switchboard's transport, and the client object it returns."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import shortuuid
from hypha_rpc.rpc import RPC

from switchboard.client import calls
from switchboard.client.events import EventHandler
from switchboard.client.policy import Jitter, ReconnectPolicy
from switchboard.client.transport import State, Transport
from switchboard.client.wire import Dial
from switchboard.clock import Clock

log = logging.getLogger(__name__)

# Manager methods that may safely run twice: retried once after a reconnection.
MANAGER_IDEMPOTENT = frozenset(
    {
        "get_service",
        "get_service_info",
        "list_services",
        "list_clients",
        "echo",
        "ping",
        "get_workspace_info",
        "parse_token",
        "check_status",
        "subscribe",
        "unsubscribe",
    }
)


async def connect(
    urls: str | Sequence[str],
    *,
    client_id: str | None = None,
    workspace: str | None = None,
    token: str | None = None,
    reconnection_token: str | None = None,
    policy: ReconnectPolicy | None = None,
    max_wait: float | None = None,
    initial_delay: float | None = None,
    max_delay: float | None = None,
    jitter: Jitter | str | None = None,
    on_event: EventHandler | None = None,
    method_timeout: float = 30.0,
    ping_interval: float = 20.0,
    clock: Clock | None = None,
    dial: Dial | None = None,
    rng: random.Random | None = None,
    **rpc_kwargs: Any,
) -> Client:
    """Connect to a Switchboard hub (or any hypha-rpc server) and stay connected.

    ``urls`` is one URL or several (replicas, or a load balancer plus direct
    addresses), tried in rotation. The reconnect settings come from
    ``policy``, else from ``max_wait``/``initial_delay``/``max_delay``/
    ``jitter`` over ``SWITCHBOARD_CLIENT_*`` variables over the defaults
    (:class:`ReconnectPolicy`). The first connection is retried within the
    same budget. Raises :class:`GaveUp` or :class:`Refused`.
    """
    url_list = [urls] if isinstance(urls, str) else list(urls)
    overrides: dict[str, Any] = {
        "max_wait": max_wait,
        "initial_delay": initial_delay,
        "max_delay": max_delay,
        "jitter": jitter,
    }
    if policy is None:
        policy = ReconnectPolicy.from_env(**overrides)
    elif any(v is not None for v in overrides.values()):
        raise TypeError("pass either policy= or the individual reconnect settings, not both")
    client_id = client_id or shortuuid.uuid()
    transport = Transport(
        url_list,
        client_id=client_id,
        workspace=workspace,
        token=token,
        reconnection_token=reconnection_token,
        policy=policy,
        clock=clock,
        dial=dial,
        rng=rng,
        ping_interval=ping_interval,
    )
    if on_event is not None:
        transport.listeners.add(on_event)
    info = await transport.open()
    rpc: RPC | None = None
    try:
        rpc_kwargs.setdefault("logger", log.getChild("rpc"))
        rpc = RPC(
            transport,
            client_id=client_id,
            workspace=info["workspace"],
            default_context={"connection_type": "websocket"},
            server_base_url=info.get("public_base_url"),
            method_timeout=method_timeout,
            **rpc_kwargs,
        )
        await _registered(rpc, method_timeout)
        manager = await rpc.get_manager_service({"timeout": method_timeout, "case_conversion": "snake"})
    except BaseException:
        if rpc is not None:
            await rpc.disconnect()
        await transport.disconnect("connect() failed")
        raise
    return Client(rpc, transport, manager)


async def _registered(rpc: RPC, timeout: float) -> None:
    """Until the RPC has announced its services to the manager (it starts on its own)."""
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def ok(data: Any) -> None:
        if not done.done():
            done.set_result(data)

    def failed(data: Any) -> None:
        if not done.done():
            done.set_exception(ConnectionError(f"could not register with the hub: {data}"))

    rpc.on("services_registered", ok)
    rpc.on("services_registration_failed", failed)
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        rpc.off("services_registered", ok)
        rpc.off("services_registration_failed", failed)


class Client:
    """A connected client: the core of what hypha-rpc's ``connect_to_server`` returns.

    Local services, event handlers and subscriptions outlive reconnections:
    the RPC re-registers services, the client re-subscribes. Other manager
    methods (``list_clients``, ``get_workspace_info``, …) are reachable as
    attributes too.
    """

    def __init__(self, rpc: RPC, transport: Transport, manager: Any) -> None:
        self.rpc = rpc
        self.transport = transport
        self._manager = manager
        self._subscriptions: dict[str, None] = {}  # desired, in order
        self.config: dict[str, Any] = {}
        self._refresh_config()
        rpc.on("manager_refreshed", self._manager_refreshed)
        rpc.on("force-exit", self._force_exit)
        # the RPC's report after re-registering the services on each new connection (the first
        # one is connect()'s): a service the hub refused is missing until the next connection
        rpc.on("services_registered", self._services_registered)
        rpc.on("services_registration_failed", self._services_not_registered)
        transport.add_ready_hook(self._resubscribe)

    # -- identity ------------------------------------------------------------------------------

    @property
    def workspace(self) -> str:
        return str(self.config["workspace"])

    @property
    def client_id(self) -> str:
        return self.transport.client_id

    @property
    def manager_id(self) -> str | None:
        return self.transport.manager_id

    @property
    def url(self) -> str:
        """The URL of the current (or last) connection."""
        return self.transport.url

    @property
    def connected(self) -> bool:
        return self.transport.state is State.READY

    # -- services ------------------------------------------------------------------------------

    async def register_service(
        self, service: dict[str, Any], config: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """Register ``service`` (re-registered after every reconnection); ``@idempotent`` functions are declared."""
        return await self.rpc.register_service(calls.declare_idempotent(service), config, **kwargs)

    async def unregister_service(self, service: dict[str, Any] | str, notify: bool = True) -> None:
        await self.rpc.unregister_service(service, notify)

    async def get_service(
        self, query: str | dict[str, Any], config: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """A service, its functions wrapped: idempotent ones retried after a reconnection, others fail fast."""
        svc = await self._manager_call("get_service")(query, config={**(config or {}), **kwargs})
        return calls.wrap_service(svc, self.transport)

    async def list_services(self, query: Any = None, **kwargs: Any) -> Any:
        return await self._manager_call("list_services")(query, **kwargs)

    async def get_service_info(self, service_id: str, config: dict[str, Any] | None = None) -> Any:
        return await self._manager_call("get_service_info")(service_id, config or {})

    async def generate_token(self, config: dict[str, Any] | None = None) -> str:
        return str(await self._manager_call("generate_token")(config or {}))

    async def echo(self, data: Any) -> Any:
        return await self._manager_call("echo")(data)

    # -- events --------------------------------------------------------------------------------

    async def subscribe(self, event_types: str | Iterable[str]) -> None:
        """Receive these broadcast event types (restored after every reconnection)."""
        types = [event_types] if isinstance(event_types, str) else list(event_types)
        for name in types:
            self._subscriptions[name] = None
        await self._manager_call("subscribe")(types)

    async def unsubscribe(self, event_types: str | Iterable[str]) -> None:
        types = [event_types] if isinstance(event_types, str) else list(event_types)
        for name in types:
            self._subscriptions.pop(name, None)
        await self._manager_call("unsubscribe")(types)

    @property
    def subscriptions(self) -> tuple[str, ...]:
        return tuple(self._subscriptions)

    def on(self, event: str, handler: Callable[[Any], Any]) -> None:
        self.rpc.on(event, handler)

    def off(self, event: str | None = None, handler: Callable[[Any], Any] | None = None) -> None:
        self.rpc.off(event, handler)

    async def emit(self, message: dict[str, Any]) -> None:
        """Send an event, e.g. ``{"type": "my-event", "to": "*", "data": ...}`` (no ``to``: local only)."""
        task = self.rpc.emit(message)
        if task is not None:
            await task

    def add_listener(self, handler: EventHandler) -> None:
        """Also send connection events (disconnected, reconnecting, …) to ``handler``."""
        self.transport.listeners.add(handler)

    def remove_listener(self, handler: EventHandler) -> None:
        self.transport.listeners.remove(handler)

    # -- lifetime ------------------------------------------------------------------------------

    async def disconnect(self) -> None:
        # the transport first: it stops a re-registration in progress before the RPC tears down
        await self.transport.disconnect()
        await self.rpc.disconnect()

    async def serve(self) -> None:
        """Wait until :meth:`disconnect`; raise :class:`GaveUp`/:class:`Refused` if the client gives up."""
        await self.transport.wait_closed()
        if self.transport.failure is not None:
            raise self.transport.failure

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.disconnect()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._manager:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return self._manager_call(name)

    def __repr__(self) -> str:
        return f"<Client {self.config.get('workspace')}/{self.client_id} {self.transport.state.value} {self.url}>"

    # -- reconnection --------------------------------------------------------------------------

    def _manager_call(self, name: str) -> calls.RemoteCall:
        return calls.RemoteCall(
            lambda: getattr(self._manager, name),
            self.transport,
            name=f"manager.{name}",
            idempotent=name in MANAGER_IDEMPOTENT,
        )

    def _refresh_config(self) -> None:
        config = dict(self._manager.get("config") or {})
        config.update(self.transport.connection_info or {})
        self.config = config

    def _manager_refreshed(self, event: dict[str, Any]) -> None:
        manager = event.get("manager") if isinstance(event, dict) else None
        if manager is not None:
            self._manager = manager
            self._refresh_config()

    async def _resubscribe(self) -> None:
        if self._subscriptions:
            await self._manager.subscribe(list(self._subscriptions))

    def _services_registered(self, report: Any) -> None:
        """hypha-rpc's ``services_registered``: ``{"total": n, "registered": n, "failed": [ids]}``."""
        failed = report.get("failed") if isinstance(report, dict) else None
        if failed:
            log.warning(
                "client %s: services %s were not re-registered on %s (see errors above)",
                self.client_id,
                ", ".join(map(str, failed)),
                self.url,
                extra={"client_id": self.client_id},
            )

    def _services_not_registered(self, report: Any) -> None:
        """hypha-rpc's ``services_registration_failed``: it could not reach the manager at all."""
        error = report.get("error") if isinstance(report, dict) else report
        log.warning(
            "client %s: no service was re-registered on %s: %s",
            self.client_id,
            self.url,
            error,
            extra={"client_id": self.client_id},
        )

    async def _force_exit(self, message: dict[str, Any]) -> None:
        if message.get("from") == f"*/{self.manager_id}":
            log.info("the hub asked %s to exit: %s", self.client_id, message.get("reason"))
            await self.disconnect()
