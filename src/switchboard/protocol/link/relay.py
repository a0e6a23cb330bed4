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

from switchboard.errors import ProtocolError
from switchboard.protocol.hypha.chunks import chunk_key
from switchboard.protocol.link import replica_wire

# The manager call's layout is the replica wire's (``protocol/link/replica_wire.py``); the router wraps and reads it here.
wrap_manager_call = replica_wire.wrap_manager_call
is_manager_call = replica_wire.is_manager_call
# A call that reached its callee's replica as the callee left, sent back to its caller's replica
# undelivered: only replicas write it (a client's frame is always re-encoded, so never starts so).
_BOUNCED = b"\x01"
# A balanced call on its way to its instance's replica, with the handle it was made through.
_BALANCED = b"\x02"


def wrap_bounced(callee: str, frame: bytes) -> bytes:
    """A call for ``callee`` that never reached it, on its way back to its caller's replica, which
    decides what becomes of it (a balanced call goes to another instance)."""
    return b"".join((_BOUNCED, callee.encode(), b"\n", frame))


def is_bounced(data: bytes) -> bool:
    return data.startswith(_BOUNCED)


def unwrap_bounced(data: bytes) -> tuple[str, bytes]:
    """``(callee, frame)`` of :func:`wrap_bounced`."""
    callee, sep, frame = data[1:].partition(b"\n")
    if not sep:
        raise ProtocolError("malformed bounced call")
    return callee.decode(errors="replace"), frame


def wrap_balanced(handle: str, frame: bytes) -> bytes:
    """A call made through the balanced handle ``handle``, for the instance's replica
    (:mod:`switchboard.hub.routing.served`)."""
    return b"".join((_BALANCED, handle.encode(), b"\n", frame))


def unwrap_balanced(data: bytes) -> tuple[str | None, bytes]:
    """``(handle, frame)`` of :func:`wrap_balanced`; ``(None, data)`` for any other frame."""
    if not data.startswith(_BALANCED):
        return None, data
    handle, sep, frame = data[1:].partition(b"\n")
    if not sep:
        raise ProtocolError("malformed balanced call")
    return handle.decode(errors="replace"), frame


def unwrap(data: bytes) -> tuple[str | None, str | None, bytes]:
    """``(origin, session, frame)``; origin and session are ``None`` for a plain frame (a balanced
    call's handle is dropped: what keeps a frame to hand on keeps it as its instance gets it)."""
    if data.startswith(_BALANCED):
        return None, None, unwrap_balanced(data)[1]
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
