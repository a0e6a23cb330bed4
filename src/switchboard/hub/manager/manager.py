"""The workspace manager: the server's own RPC peer, ``*/<manager_id>:default``.

It is hosted with ``hypha_rpc.RPC`` (protocol §4.2), which gives chunking,
heartbeats and callback handling for free; this module supplies the link that
plugs that RPC into the hub's router, and the methods of the ``default``
service about the workspace, its clients and tokens; those about services are
the :class:`~switchboard.hub.manager.service_directory.ServiceDirectory`'s. Each replica answers the manager calls of its own clients, so every
caller is a local :class:`~switchboard.hub.sessions.peer.Peer` whose user we know.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any, Protocol

from hypha_rpc import RPC

from switchboard.backends.base import WorkspaceStore
from switchboard.backends.logins import LoginStore
from switchboard.backends.queues import QueueStore
from switchboard.clock import Clock
from switchboard.errors import AuthError, LimitExceeded, PermissionDenied, ProtocolError
from switchboard.hub.identity import oidc_login
from switchboard.hub.identity.auth import MAX_EXTRA_SCOPES, TokenIssuer, check_extra_scope, child_user
from switchboard.hub.identity.credentials import REVOKED, Credentials
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.manager.admin_utils import AdminHost, AdminUtils
from switchboard.hub.manager.balanced_lookup import BalancedLookups
from switchboard.hub.manager.builtin_services import BuiltIns, schema_service
from switchboard.hub.manager.event_log import EventLog
from switchboard.hub.manager.login_service import LOGIN_PATH, LoginService
from switchboard.hub.manager.manager_door import ManagerDoor, calling_peer, require
from switchboard.hub.manager.ownership import anyone_may_create
from switchboard.hub.manager.service_directory import DirectoryHost, ServiceDirectory
from switchboard.hub.manager.task_queue import TaskQueue
from switchboard.hub.manager.workspace_data import WorkspaceData
from switchboard.hub.manager.workspace_records import WorkspaceRecords
from switchboard.hub.routing.balance import Balanced, Refuse, Resend
from switchboard.hub.routing.uploads import MAX_OPEN_UPLOADS, UPLOAD_IDLE_TIMEOUT, Uploads
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.sessions.subscribers import Subscribers
from switchboard.protocol.hypha import envelope, ids
from switchboard.protocol.hypha.handshake import HYPHA_VERSION
from switchboard.protocol.hypha.remote_errors import bare_reject
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.protocol.hypha.values import plain
from switchboard.tasks import cancel_and_wait, spawn

log = logging.getLogger(__name__)


class ManagerHost(DirectoryHost, AdminHost, Protocol):
    """What the manager needs of the hub that hosts it (the hub is :class:`switchboard.hub.hub.Hub`)."""

    clock: Clock
    issuer: TokenIssuer
    credentials: Credentials
    manager_id: str
    workspaces: WorkspaceStore
    subscribers: Subscribers
    logins: LoginStore
    queues: QueueStore

    balanced: Balanced

    async def route_from_manager(self, data: bytes) -> None: ...

    async def deletion(self, user: User, workspace: str) -> str | None: ...

    def balanced_steps(self, steps: list[Resend | Refuse]) -> None: ...

    def balanced_bound(self, peer: Peer, target: str, error: str | None) -> None: ...

    def holds(self, client: str) -> bool: ...

    async def emit_event(self, workspace: str, event_type: str, data: object) -> None: ...

    async def end_workspace(self, workspace: str) -> None: ...

    async def end_credential(self, token_id: str, *, answering: Peer | None = None) -> None: ...

    async def purge(self, workspace: str, client_id: str, *, owner: str | None = None) -> int: ...


# A year: long-lived service tokens fit; an infinite or absurd expiry is a mistake.
MAX_TOKEN_LIFETIME = 365 * 24 * 3600.0
# An anonymous user's tokens: a day, so their revocations (charged to all anonymous users as one) lapse soon.
MAX_ANONYMOUS_TOKEN_LIFETIME = 24 * 3600.0
# The longest a ping may wait for its answer: hypha-rpc's default call timeout. A
# caller would give up on a longer ping before it ended, while the manager kept
# a task and a session waiting for it.
MAX_PING_TIMEOUT = 30.0
# An email a generated token carries (set only by callers with the hub's admin role).
_EMAIL = re.compile(r"[^@\s]{1,64}@[^@\s]+\.[^@\s]+")


class _RouterLink:
    """The duck-typed connection ``hypha_rpc.RPC`` expects, wired to the hub."""

    manager_id = None  # the manager does not register itself with a manager

    def __init__(self, hub: ManagerHost) -> None:
        self._hub = hub
        self.handler: Callable[[bytes | dict[str, Any]], None] | None = None  # hypha-rpc takes both
        self.sent: Callable[[bytes], None] | None = None  # shown each frame the RPC emits

    def on_message(self, handler: Callable[[bytes | dict[str, Any]], None]) -> None:
        self.handler = handler

    def on_connected(self, handler: Any) -> None:
        """The manager never reconnects; nothing to remember."""

    def on_disconnected(self, handler: Any) -> None:
        """The manager never reconnects; nothing to remember."""

    async def emit_message(self, data: bytes) -> None:
        data = bare_reject(data)  # an error goes out as its type and message, never the hub's traceback
        if self.sent is not None:
            self.sent(data)
        await self._hub.route_from_manager(data)

    async def disconnect(self, reason: str | None = None) -> None:
        self.handler = None


class WorkspaceManager:
    """The ``default`` service every client talks to, and the hub's own RPC peer."""

    def __init__(self, hub: ManagerHost) -> None:
        self.hub = hub
        self.link = _RouterLink(hub)
        self.rpc: RPC | None = None
        # the hub's built-in services besides this one: public/queue, ws-user-root/admin-utils
        self.queue = TaskQueue(hub.queues, clock=hub.clock, max_item_bytes=hub.settings.max_queue_item_bytes)
        self.admin = AdminUtils(hub)
        self.builtins = BuiltIns(hub.manager_id, hub.manager_address, rpc=lambda: self.rpc)
        # the methods about services
        self.directory = ServiceDirectory(hub, rpc=lambda: self.rpc, builtins=self.builtins)
        self.balancing = BalancedLookups(
            hub.balanced, clock=hub.clock, instances=self.directory.instances, present=hub.holds
        )
        self.balancing.on_steps = hub.balanced_steps
        self.balancing.on_bound = hub.balanced_bound
        self.directory.balancing = self.balancing
        # workspaces as records, their event log, their environment and service types
        self.records = WorkspaceRecords(
            hub,
            events=None,
            directory=self.directory,
            ping=self.ping,
            tombstone_ttl=max(MAX_TOKEN_LIFETIME, hub.settings.reconnection_token_lifetime),
        )
        self.events = EventLog(hub, keep=self.records.keep, require=self.records.require)
        self.records.events = self.events
        self.data = WorkspaceData(hub.workspaces, self.records)
        s0 = hub.settings  # public/hypha-login: signing people in at the operator's provider
        self.login = LoginService(
            hub.logins,
            clock=hub.clock,
            issuer=hub.issuer,
            credentials=hub.credentials,
            permission=self.records.permission,
            client=oidc_login.login_client(s0, f"{s0.public_base_url}{LOGIN_PATH}/callback"),
            public_base_url=s0.public_base_url,
        )
        self._sending: set[asyncio.Task[Any]] = set()  # answers the door sends
        s = hub.settings
        self.door = ManagerDoor(
            handler=lambda: self.link.handler,
            send=lambda frame: spawn(self._sending, hub.route_from_manager(frame)),
            uploads=Uploads(
                clock=hub.clock,
                keep=True,
                max_bytes=s.max_upload_bytes,
                max_uploads=MAX_OPEN_UPLOADS,
                idle_timeout=UPLOAD_IDLE_TIMEOUT,
                allow_encrypted=s.allow_encrypted_payloads,
            ),
            # the calls every client makes while connecting: plain data in, plain data out
            plain_calls={
                "services.default.register_service": self.directory.register_service,
            },
            # of which decided without I/O: answered before the client's next frame is read
            immediate_calls={
                "services.default.subscribe": self.subscribe_now,
                "services.default.unsubscribe": self.unsubscribe_now,
            },
        )

    async def start(self) -> None:
        hub = self.hub
        self.door.service_answer.forget()
        self.link.sent = self.door.service_answer.saw
        self.rpc = RPC(
            self.link,
            client_id=hub.manager_id,
            workspace="*",
            server_base_url=hub.settings.public_base_url,
            silent=True,
            method_timeout=hub.settings.call_timeout,
        )
        await self.rpc.register_service(self._service(), {"notify": False})
        for built_in in (self.queue.service(), self.login.service(), self.admin.service()):
            await self.rpc.register_service(schema_service(built_in), {"notify": False})

    async def stop(self) -> None:
        await self.balancing.close()
        await cancel_and_wait(self.door.calls)
        if self.rpc is not None:
            self.rpc.close()
            self.rpc = None

    def receive(self, frame: bytes, caller: Peer | None = None, env: envelope.Envelope | None = None) -> None:
        """Hand a frame addressed to the manager to its RPC, through the door's checks.

        ``caller`` is the local client that sent it; the manager's services
        act for that client alone (``None``: a provider's reply, or our own).
        ``env``: the frame already decoded, as the router stamped it.
        """
        self.door.receive(frame, caller, env)

    def forget(self, peer: Peer) -> None:
        """``peer`` was detached: what the door kept for its client (its pieces of a chunked message)
        goes, and what the directory kept for the connection (its services, its select: allowance)."""
        self.door.forget(peer.id)
        self.directory.forget(peer)

    def methods(self) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
        """The ``default`` service's functions by name, with their parameters' schema."""
        methods: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
            "echo": (self.echo, {"data": {}}),
            "log": (self.events.log, {"msg": {}}),
            "register_service": (self.directory.register_service, {"service": {"type": "object"}, "config": {}}),
            "unregister_service": (self.directory.unregister_service, {"service_id": {"type": "string"}}),
            "get_service_info": (self.directory.get_service_info, {"service_id": {"type": "string"}, "config": {}}),
            "get_service": (self.directory.get_service, {"service_id": {"type": "string"}, "config": {}}),
            "list_services": (self.directory.list_services, {"query": {}, "include_unlisted": {"type": "boolean"}}),
            "list_clients": (self.list_clients, {"workspace": {"type": "string"}}),
            "ping": (self.ping, {"client_id": {"type": "string"}, "timeout": {"type": "number"}}),
            "generate_token": (self.generate_token, {"config": {"type": "object"}}),
            "parse_token": (self.parse_token, {"token": {"type": "string"}}),
            "revoke_token": (self.revoke_token, {"token": {"type": "string"}}),
            "subscribe": (self.subscribe, {"event_type": {}}),
            "unsubscribe": (self.unsubscribe, {"event_type": {}}),
            "check_status": (self.check_status, {}),
        }
        methods.update(self._record_methods())
        return methods

    def built_in_methods(self, key: tuple[str, str]) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
        """The functions of the built-in service ``key`` (:data:`~.builtin_services.BUILT_IN`), by name."""
        spec = (
            self.queue.service()
            if key[1] == "queue"
            else self.login.service()
            if key[1] == "hypha-login"
            else self.admin.service()
        )
        return {name: value for name, value in spec.items() if isinstance(value, tuple)}

    def _service(self) -> dict[str, Any]:
        s = self.hub.settings
        return schema_service(
            {
                "id": "default",
                "name": "Default workspace management service",
                "description": "Services for managing workspace.",
                "config": {
                    "require_context": True,
                    "visibility": "public",
                    "server_id": s.server_id,
                    "public_base_url": s.public_base_url,
                    "hypha_version": HYPHA_VERSION,
                },
                **self.methods(),
            }
        )

    def _record_methods(self) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
        r, e, d = self.records, self.events, self.data
        ws: dict[str, Any] = {"workspace": {"type": "string"}}
        any_: dict[str, Any] = {}
        times = {"event_type": {"type": "string"}, "start_time": any_, "end_time": any_}
        return {
            "get_workspace_info": (r.get_workspace_info, ws),
            "create_workspace": (r.create_workspace, {"config": {"type": "object"}, "overwrite": {"type": "boolean"}}),
            "delete_workspace": (r.delete_workspace, ws),
            "list_workspaces": (r.list_workspaces, {"match": any_, "offset": any_, "limit": any_}),
            "get_summary": (r.get_summary, {}),
            "cleanup": (r.cleanup, {**ws, "timeout": {"type": "number"}}),
            "bookmark": (r.bookmark, {"item": {"type": "object"}}),
            "unbookmark": (r.unbookmark, {"item": {"type": "object"}}),
            "set_env": (d.set_env, {"key": {"type": "string"}, "value": any_}),
            "get_env": (d.get_env, {"key": any_}),
            "register_service_type": (d.register_service_type, {"type_info": {"type": "object"}}),
            "get_service_type": (d.get_service_type, {"type_id": {"type": "string"}}),
            "list_service_types": (d.list_service_types, ws),
            "log_event": (e.log_event, {"event_type": {"type": "string"}, "data": any_}),
            "get_events": (e.get_events, times),
            "get_event_stats": (e.get_event_stats, times),
        }

    # -- helpers -------------------------------------------------------------

    async def answers_ping(self, address: str, timeout: float = 2.0) -> bool:
        try:
            assert self.rpc is not None
            await self.rpc.ping(address, timeout)
        except Exception:
            return False
        return True

    # -- the default service -------------------------------------------------

    async def echo(self, data: Any, context: dict[str, Any] | None = None) -> Any:
        """Return ``data`` unchanged (a round-trip test)."""
        peer = calling_peer()
        require(peer, peer.workspace, Permission.READ_WRITE)
        return data

    async def list_clients(self, workspace: Any = None, context: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every client of a workspace (those that registered their built-in service)."""
        peer = calling_peer()
        ws = ids.check_id(workspace or peer.workspace, "workspace")
        require(peer, ws, Permission.READ)
        found = await self.hub.registry.find(ServiceQuery(ws, "*", "built-in"))
        return [{"id": i["id"].rpartition(":")[0], "user": i["config"].get("created_by")} for i in found]

    async def ping(self, client_id: Any, timeout: float = 5, context: dict[str, Any] | None = None) -> str:
        """``"pong"`` if the client answers, else a string saying why not (never raises).

        Whether a client is connected is the workspace's business: a ping
        needs ``read`` on the target's workspace (as Hypha's), and a refusal
        reads the same for a connected client and an absent one. ``timeout``
        is at most :data:`MAX_PING_TIMEOUT` seconds.
        """
        peer = calling_peer()
        if not isinstance(client_id, str):
            return f"Failed to ping client {client_id!r}: client_id must be a string"
        ws, slash, cid = client_id.rpartition("/")
        if not ids.is_id(cid) or (slash and not ids.is_id(ws)):
            return f"Failed to ping client {client_id[:140]!r}: ids are {ids.GRAMMAR}"
        ws = ws if slash else peer.workspace
        if not peer.user.can(ws, Permission.READ):
            return f"Failed to ping client {client_id}: Permission denied for workspace {ws}"
        if (
            not isinstance(timeout, int | float)
            or isinstance(timeout, bool)
            or not 0 < timeout <= MAX_PING_TIMEOUT  # NaN fails this too
        ):
            return (
                f"Failed to ping client {client_id}: timeout must be a number of seconds above 0 "
                f"and at most {MAX_PING_TIMEOUT:g}"
            )
        target = f"{ws}/{cid}"
        try:
            assert self.rpc is not None
            await self.rpc.ping(target, float(timeout))
        except Exception as exc:
            return f"Failed to ping client {client_id}: {exc or type(exc).__name__}"
        return "pong"

    async def generate_token(self, config: Any = None, context: dict[str, Any] | None = None) -> str:
        """A token for another client to join a workspace with a given permission."""
        peer = calling_peer()
        config = plain(config) or {}
        if not isinstance(config, dict):
            raise ProtocolError("generate_token expects a config object")
        ws = ids.check_id(config.get("workspace") or peer.workspace, "workspace")
        if await self.records.permission(peer.user, ws) < Permission.ADMIN:  # an owner is admin
            raise PermissionDenied("Only admin can generate token.")
        if anyone_may_create(ws) and await self.records.store.get(ws) is None:
            # no token grants rights in a name any user may create before its record exists: the
            # first user to create it would own it, and every token for it (a hub admin's included)
            raise PermissionDenied(
                f"Cannot generate a token for workspace {ws}: it has no record, and any user may create one "
                f"under that name; create it first (create_workspace({{'id': '{ws}'}}))"
            )
        # what a token is minted from is checked at each mint: no revoked credential (nor one it
        # descends from), none older than the workspace's deletion (a new token would launder it)
        if await self.hub.credentials.revocations.any_revoked(peer.user.revocation_ids):
            raise PermissionDenied(f"Cannot generate a token: {REVOKED}")
        if (refusal := await self.hub.deletion(peer.user, ws)) is not None:
            raise PermissionDenied(f"Cannot generate a token: {refusal} after your token was issued")
        extra_scopes, email = self._token_labels(peer.user, config)
        client_id = config.get("client_id")
        if client_id is not None:
            ids.check_id(client_id, "client id")
        permission_name = config.get("permission") or "read_write"
        if not isinstance(permission_name, str):
            raise ProtocolError("permission must be one of read, read_write or admin")
        try:
            permission = Permission.parse(permission_name)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        expires_in = config.get("expires_in") or 3600
        if (
            not isinstance(expires_in, int | float)
            or isinstance(expires_in, bool)
            or not 0 < expires_in <= MAX_TOKEN_LIFETIME
        ):
            raise ProtocolError(f"expires_in must be a number of seconds from 0 to {MAX_TOKEN_LIFETIME:g}")
        # a token's lifetime never grows through what is derived from it: one minted
        # with a credential expires with that credential (an anonymous user has none)
        bound = peer.user.credential_expires_at
        if bound is not None:
            left = bound - self.hub.issuer.clock.time()
            if left <= 0:
                raise PermissionDenied("Your token has expired: connect again with a fresh one to generate tokens.")
            expires_in = min(float(expires_in), left)
        if peer.user.is_anonymous:
            expires_in = min(float(expires_in), MAX_ANONYMOUS_TOKEN_LIFETIME)
        try:
            user = child_user(peer.user, workspace=ws, permission=permission, extra_scopes=extra_scopes, email=email)
        except AuthError as exc:
            raise PermissionDenied(str(exc)) from None
        return self.hub.issuer.issue(
            user,
            workspace=ws,
            permission=permission,
            expires_in=float(expires_in),
            client_id=client_id,
        )

    @staticmethod
    def _token_labels(user: Any, config: dict[str, Any]) -> tuple[tuple[str, ...], str | None]:
        """``extra_scopes`` and ``email`` for a generated token, checked.

        A token's rights never grow through what is derived from it: a caller
        adds only extra scopes it holds itself, and sets an email only with
        the hub's admin role (as Hypha's), unless it has that role.
        """
        extra = config.get("extra_scopes") or []
        if not isinstance(extra, list) or len(extra) > MAX_EXTRA_SCOPES:
            raise ProtocolError(f"extra_scopes must be a list of at most {MAX_EXTRA_SCOPES} strings")
        try:
            checked = tuple(dict.fromkeys(check_extra_scope(x) for x in extra))
        except AuthError as exc:
            raise ProtocolError(str(exc)) from None
        is_admin = "admin" in user.roles
        beyond = [x for x in checked if x not in user.extra_scopes]
        if beyond and not is_admin:
            raise PermissionDenied(f"Cannot grant extra scopes your own token does not carry: {', '.join(beyond)}")
        email = config.get("email")
        if email is not None:
            if not is_admin:
                raise PermissionDenied("Only callers with the 'admin' role may set the token's email")
            if not isinstance(email, str) or len(email) > 254 or not _EMAIL.fullmatch(email):
                raise ProtocolError("email must be an email address")
        return checked, email

    async def parse_token(self, token: Any, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """The user a token issued by this hub stands for."""
        calling_peer()
        user = await self.hub.credentials.verify(token)
        wire: dict[str, Any] = user.to_wire(user.current_workspace, user.client_id)
        return wire

    async def revoke_token(self, token: Any, context: dict[str, Any] | None = None) -> None:
        """Refuse ``token``, and every token derived from it (reconnection tokens, generated tokens
        and theirs), on every replica until it expires; the sessions standing on it are closed.

        Its holder may revoke it, and so may an admin of its workspace.
        """
        peer = calling_peer()
        revoked = await self.hub.credentials.revoke(token, by=peer.user)
        await self.hub.end_credential(revoked, answering=peer)

    async def subscribe(self, event_type: Any, context: dict[str, Any] | None = None) -> bool:
        """Receive workspace broadcasts of these event types on this connection.

        What a connection holds is bounded (``--max-subscriptions-per-client``
        names of at most ``--max-event-type-length`` characters) and freed
        when it closes; a call that would pass a bound is refused whole.
        """
        return self.subscribe_now(event_type)

    def subscribe_now(self, event_type: Any) -> bool:
        """:meth:`subscribe`, decided without I/O (the door answers it before the caller's next frame)."""
        peer = calling_peer()
        s = self.hub.settings
        names = _event_names(event_type)
        for name in names:
            if len(name) > s.max_event_type_length:
                raise LimitExceeded(
                    f"Event type too long ({len(name)} characters, {name[:40]!r}...): event types may have at most "
                    f"{s.max_event_type_length} characters (--max-event-type-length/SWITCHBOARD_MAX_EVENT_TYPE_LENGTH)"
                )
            refusal = subscription_refusal(name, peer.workspace)
            if refusal is not None:
                raise PermissionDenied(refusal)
        held = self.hub.subscribers.names_of(peer)
        added = set(names) - held
        if len(held) + len(added) > s.max_subscriptions_per_client:
            raise LimitExceeded(
                f"Too many event types: a connection may subscribe to at most {s.max_subscriptions_per_client} event "
                f"types at once (--max-subscriptions-per-client/SWITCHBOARD_MAX_SUBSCRIPTIONS_PER_CLIENT); it holds "
                f"{len(held)} and asked for {len(added)} more: unsubscribe from some first"
            )
        self.hub.subscribers.add(peer, added)
        return True

    async def unsubscribe(self, event_type: Any, context: dict[str, Any] | None = None) -> bool:
        """Stop receiving these event types."""
        return self.unsubscribe_now(event_type)

    def unsubscribe_now(self, event_type: Any) -> bool:
        """:meth:`unsubscribe`, decided without I/O."""
        peer = calling_peer()
        self.hub.subscribers.remove(peer, _event_names(event_type))
        return True

    async def check_status(self, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """Whether the workspace is ready, and the caller's permission in it."""
        peer = calling_peer()
        return {"status": "ready", "user_permission": peer.user.permission(peer.workspace).code}


def may_subscribe(name: str, workspace: str) -> bool:
    """Whether a client of ``workspace`` may subscribe to the event type ``name``, as Hypha decides:
    a server event type, or a name that names no workspace (``<ws>/...``, ``ws-...``) but its own."""
    return subscription_refusal(name, workspace) is None


def subscription_refusal(name: str, workspace: str) -> str | None:
    """Why a client of ``workspace`` may not subscribe to ``name`` (``None``: it may), in Hypha's words."""
    if name in envelope.SERVER_EVENT_TYPES:
        return None
    if "/" in name:
        named = name.partition("/")[0]
        if named == workspace:
            return None
        return (
            f"Subscription to event '{name}' is forbidden. Event workspace '{named}' does not match your "
            f"workspace '{workspace}'. Clients can only subscribe to events within their own workspace or system events."
        )
    if not name.startswith("ws-") or name == workspace:
        return None
    return (
        f"Subscription to event '{name}' is forbidden as it contains workspace identifiers. Clients can only "
        f"subscribe to events within their own workspace ({workspace}) or system events."
    )


def _event_names(event_type: Any) -> list[str]:
    names = [event_type] if isinstance(event_type, str) else plain(event_type)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ProtocolError("event_type must be a non-empty string or list of strings")
    return names
