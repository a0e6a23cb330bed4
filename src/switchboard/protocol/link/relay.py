"""Frames between replicas, and which replica a manager reply belongs to.

Every replica hosts the manager under the same id (clients keep the first one
they saw), so a provider's reply to ``*/<manager_id>`` lands on the
provider's replica, not necessarily on the one whose manager made the call.
A manager call that crosses to another replica therefore travels wrapped with
its origin and session; the receiving replica remembers ``session → origin``
and sends the reply back there. Pure functions here; the table lives in the hub.

A reply larger than one frame does not come as one ``<session>.resolve``:
hypha-rpc sends it as calls to the receiver's ``message_cache`` service
(``services.built-in.message_cache.create/set/append/process/remove``), all
addressed to ``*/<manager_id>`` and keyed by the session being answered (their
first argument). Those calls must reach the same replica as the reply would.
"""

from __future__ import annotations

from switchboard.protocol.hypha.chunks import chunk_key
from switchboard.protocol.link import replica_wire


def unwrap(data: bytes) -> tuple[str | None, str | None, bytes]:
    """``(origin, session, frame)``; origin and session are ``None`` for a plain frame (a balanced
    call's handle is dropped: what keeps a frame to hand on keeps it as its instance gets it)."""
    handle, frame = replica_wire.unwrap_balanced(data)
    if handle is not None:
        return None, None, frame
    return replica_wire.unwrap(data)


def session_root(method: object) -> str | None:
    """The caller-side session a reply method belongs to: ``"abc.resolve"`` → ``"abc"``.

    Service calls (``services.<id>.<fn>``) are not replies and give ``None``.
    """
    if not isinstance(method, str) or "." not in method:
        return None
    root = method.partition(".")[0]
    return None if root == "services" or not root else root


def manager_session(method: object, extra: bytes | memoryview) -> str | None:
    """The caller-side session root a frame to the manager answers, if any.

    ``"abc.resolve"`` → ``"abc"``; a ``message_cache`` call keyed ``"abc"`` (or
    ``"abc.def"``) → ``"abc"``; anything else (a call of the manager's own
    services) → ``None``.
    """
    key = chunk_key(method, extra)
    if key is not None:
        return key.partition(".")[0]
    return session_root(method)


def manager_in_workspace(target: object, method: object, manager_id: str) -> str | None:
    """The workspace of a callback call addressed to the manager as a member of it, else ``None``.

    hypha-rpc addresses a function the manager passed as an argument (an app's ``receive`` and
    ``send``) as ``<workspace>/<manager id>``, the workspace of the caller the manager acted
    for, and accepts an answer only from that address. Session calls only
    (``<session>.<function>``): a call of the manager's services is answered as the manager.
    """
    if not isinstance(target, str) or session_root(method) is None:
        return None
    ws, _, cid = target.partition("/")
    return ws if cid == manager_id and ws not in ("", "*") else None
