"""Frames between replicas, and which replica a manager reply belongs to.

Every replica hosts the manager under the same id (clients keep the first one
they saw), so a provider's reply to ``*/<manager_id>`` lands on the
provider's replica, not necessarily on the one whose manager made the call.
A manager call that crosses to another replica therefore travels wrapped with
its origin and session; the receiving replica remembers ``session → origin``
and sends the reply back there. Pure functions here; the table lives in the hub.
"""

from __future__ import annotations

from switchboard.errors import ProtocolError

# A msgpack map never starts with 0x00, so one byte tells wrapped from raw.
_MANAGER_CALL = b"\x00"


def wrap_manager_call(origin: str, session: str, frame: bytes) -> bytes:
    return b"".join((_MANAGER_CALL, origin.encode(), b"\n", session.encode(), b"\n", frame))


def unwrap(data: bytes) -> tuple[str | None, str | None, bytes]:
    """``(origin, session, frame)``; origin and session are ``None`` for a plain frame."""
    if not data.startswith(_MANAGER_CALL):
        return None, None, data
    try:
        origin, session, frame = data[1:].split(b"\n", 2)
        return origin.decode(), session.decode(), frame
    except ValueError:
        raise ProtocolError("malformed relayed manager call") from None


def session_root(method: object) -> str | None:
    """The caller-side session a reply method belongs to: ``"abc.resolve"`` → ``"abc"``.

    Service calls (``services.<id>.<fn>``) are not replies and give ``None``.
    """
    if not isinstance(method, str) or "." not in method:
        return None
    root = method.partition(".")[0]
    return None if root == "services" or not root else root
