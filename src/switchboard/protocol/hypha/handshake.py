"""The first frame, ``connection_info`` and the text control frames (protocol §2)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from switchboard.errors import HandshakeError
from switchboard.protocol.hypha import ids

# WebSocket close codes used during the handshake, as the reference uses them.
CLOSE_POLICY = 1008  # bad or missing auth payload, bad token
CLOSE_UNSUPPORTED = 1003  # first frame is not JSON
CLOSE_GOING_AWAY = 1001  # refused by policy after auth (workspace, duplicate id)
CLOSE_TRY_AGAIN = 1013  # overloaded or draining: retry later
CLOSE_RESTARTING = 1012  # a draining replica sends its clients to a sibling

# The Hypha version the hub says it is, in connection_info and the manager's
# service config: that of the reference server whose protocol it speaks
# (clients may read it to pick features; none of 0.21.x refuses it).
HYPHA_VERSION = "0.21.135"


@dataclass(frozen=True, slots=True)
class Hello:
    """What a client says about itself in its first frame."""

    client_id: str
    workspace: str | None
    token: str | None
    reconnection_token: str | None


def parse_hello(text: str | bytes) -> Hello:
    """Validate the client's first frame; raise :class:`HandshakeError` with the reason."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise HandshakeError("Failed to decode authentication information", CLOSE_UNSUPPORTED) from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deeply
        raise HandshakeError("Failed to decode authentication information", CLOSE_UNSUPPORTED) from None
    if not isinstance(data, dict):
        raise HandshakeError(
            "Failed to decode authentication information: expected a JSON object",
            CLOSE_UNSUPPORTED,
        )
    client_id = data.get("client_id")
    if not isinstance(client_id, str) or not client_id:
        raise HandshakeError("Failed to establish connection: client_id is missing", CLOSE_GOING_AWAY)
    if not ids.is_id(client_id):
        raise HandshakeError(
            f"Failed to establish connection: invalid client_id {client_id[:64]!r} "
            "(letters, digits, '_', '-', '|', '.'; at most 128)",
            CLOSE_GOING_AWAY,
        )
    workspace = _optional_str(data, "workspace")
    if workspace is not None and not ids.is_id(workspace):
        raise HandshakeError(
            f"Failed to establish connection: invalid workspace name {workspace[:64]!r}",
            CLOSE_GOING_AWAY,
        )
    return Hello(
        client_id=client_id,
        workspace=workspace,
        token=_optional_str(data, "token"),
        reconnection_token=_optional_str(data, "reconnection_token"),
    )


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise HandshakeError(
            f"Failed to decode authentication information: {key!r} must be a string",
            CLOSE_POLICY,
        )
    return value


def error_text(message: str) -> str:
    return json.dumps({"type": "error", "message": message})


PONG = json.dumps({"type": "pong"})

RESTARTING = "restarting"


def restarting_text(reason: str) -> str:
    """What a draining replica sends a WebSocket client just before it ends the stream (no close frame):
    reconnect elsewhere, as after a close with :data:`CLOSE_RESTARTING` (``switchboard.server.ws.ws_protocol``)."""
    return json.dumps({"type": RESTARTING, "code": CLOSE_RESTARTING, "reason": reason})


def reconnection_token_text(token: str) -> str:
    return json.dumps({"type": "reconnection_token", "reconnection_token": token})


def parse_control(text: str) -> str | None:
    """The ``type`` of a text control frame, or ``None`` when it is not one we know."""
    if len(text) > 1000:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." of a few hundred chars
        return None
    if isinstance(data, dict) and data.get("type") in ("ping", "refresh_token"):
        kind: str = data["type"]
        return kind
    return None
