"""The workspace manager's functions over plain HTTP: ``/{workspace}/services/~/<function>``.

The manager's methods take their caller from
:data:`~switchboard.hub.manager.manager_door.CALLER`, a :class:`~switchboard.hub.sessions.peer.Peer`
whose user and workspace every permission check reads. An HTTP request has
no connection, so it gets a caller of its own for the call: the request's
user (its token's, or a fresh anonymous user with no grant), never the
manager's root user. Like a WebSocket client, it is *in* a workspace only
if it may read it: the path's workspace when its token (or the workspace's
record, for an owner) grants read there, otherwise its own, as an HTTP
service call acts. So every check runs exactly as for a WebSocket client
connected there. Functions that only make sense on a connection
(subscriptions, registrations) are refused, and so are bookmarks to an
anonymous request (they live in a personal workspace it does not keep).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import shortuuid

from switchboard.errors import NotFound, RequestRefused
from switchboard.hub.hub import Hub
from switchboard.hub.identity.users import Permission, User, new_anonymous_user
from switchboard.hub.manager.manager_door import CALLER
from switchboard.hub.manager.task_queue import MAX_POP_TIMEOUT
from switchboard.hub.sessions.peer import Peer

# These act on the caller's connection (its subscriptions, its services): an HTTP request has none.
CONNECTION_ONLY = frozenset({"register_service", "unregister_service", "subscribe", "unsubscribe"})
# These keep data in the caller's personal workspace, which an anonymous HTTP request does not keep.
PERSONAL = frozenset({"bookmark", "unbookmark"})


class _NoConnection:
    """The transport of an HTTP caller: nothing is ever sent to it (it is never routed to)."""

    def try_send(self, frame: bytes | str) -> bool:
        return False

    async def send_bytes(self, data: bytes) -> None:
        """An HTTP caller receives nothing but its call's answer."""

    async def send_text(self, text: str) -> None:
        """An HTTP caller receives nothing but its call's answer."""

    async def close(self, code: int, reason: str) -> None:
        """Nothing to close."""


async def http_caller(hub: Hub, *, user: User, own_workspace: str, workspace: str, anonymous: bool) -> Peer:
    """The caller an HTTP request stands for in ``workspace`` (the path's), as a connection would."""
    if anonymous:
        # a user of its own, never one whose personal workspace every anonymous request would
        # share; it stays in a workspace where it holds nothing (``own_workspace``, not its
        # personal one), so an anonymous request writes nothing anywhere
        user = new_anonymous_user()
    user = await hub.http.as_owner(user, workspace)  # an owner named in the record is its admin
    acting = workspace if user.can(workspace, Permission.READ) else own_workspace
    return Peer(
        workspace=acting,
        client_id=f"http-{shortuuid.uuid()[:12]}",
        user=user,
        transport=_NoConnection(),
        max_queue_bytes=0,
        replica_id=hub.replica_id,
    )


async def call_manager(hub: Hub, caller: Peer, function: str, kwargs: dict[str, Any], *, workspace: str) -> Any:
    """Run one of the manager's functions for ``caller`` with ``kwargs``, or a clear refusal.

    A listing without a query lists the path's ``workspace`` (what a URL under it
    means), with the visibility rules of any other listing of it.
    """
    if function in CONNECTION_ONLY:
        raise RequestRefused(
            400,
            f"{function} acts on the caller's connection: call it from a connected client "
            "(WebSocket or the /rpc HTTP transport), not over plain HTTP",
        )
    if function in PERSONAL and caller.user.is_anonymous:
        raise RequestRefused(
            400, f"{function} keeps its data in the caller's personal workspace: an anonymous HTTP request has none"
        )
    found = hub.http.methods().get(function)
    if found is None:
        raise NotFound(f"{function} not found.")
    if function == "list_services" and kwargs.get("query") is None:
        kwargs = {**kwargs, "query": {"workspace": workspace}}
    return await _run(found[0], caller, function, kwargs, timeout=hub.settings.call_timeout)


async def call_built_in(hub: Hub, caller: Peer, key: tuple[str, str], function: str, kwargs: dict[str, Any]) -> Any:
    """Run a function of a built-in service (``public/queue``, ``admin-utils``) for ``caller``: each acts on
    the caller's own workspace and checks its rights there, as for a connection. A pop may wait its own
    timeout besides the call's."""
    found = hub.http.built_in_methods(key).get(function)
    if found is None:
        raise NotFound(f"{function} not found.")
    timeout = hub.settings.call_timeout + (MAX_POP_TIMEOUT if function == "pop" else 0.0)
    return await _run(found[0], caller, function, kwargs, timeout=timeout)


async def _run(method: Any, caller: Peer, function: str, kwargs: dict[str, Any], *, timeout: float) -> Any:
    if "context" in kwargs:
        raise RequestRefused(400, "context is set by the hub, not by the caller")
    try:
        inspect.signature(method).bind(**kwargs)
    except TypeError as exc:
        raise RequestRefused(400, f"Bad arguments for {function}: {exc}") from None
    token = CALLER.set(caller)  # the call's task inherits it, as the RPC's tasks do
    try:
        return await asyncio.wait_for(method(**kwargs), timeout)
    finally:
        CALLER.reset(token)
