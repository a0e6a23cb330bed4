"""Switchboard's exceptions, one tree rooted in :class:`SwitchboardError`.

::

    SwitchboardError
    ├── ConfigError (ValueError)          a setting has a bad value
    ├── UnsupportedServer (RuntimeError)  uvicorn or websockets outside the versions tested
    ├── ProtocolError                     a peer sent something we cannot accept
    │   ├── HandshakeError                the first frame was refused (carries a close code)
    │   ├── FrameTooLarge                 a frame above the size limit
    │   └── EncryptedPayload              an end-to-end encrypted payload the hub does not let through
    ├── AuthError                         a token is missing, invalid or expired
    ├── PermissionDenied (PermissionError)
    ├── NotFound (KeyError)               a workspace, service or function does not exist
    ├── TargetNotConnected                a message's target has no live connection
    ├── LimitExceeded                     a per-client quota was hit
    │   └── RateLimited                       a caller over its rate or calls in flight (retry later)
    ├── BackendError                      the registry or bus failed (e.g. Redis down)
    │   └── LeaseLost                         this replica no longer holds a lease (replicas/upkeep/lease.py)
    ├── RequestRefused                    an HTTP request answered with a status of its own
    ├── JsonRpcError                      an MCP request answered with a JSON-RPC error (server/http/http_mcp.py)
    └── client errors (client/errors.py):  GaveUp (ConnectionError), Refused (ConnectionAbortedError),
                                           CallInterrupted, ClientClosed

Where a caller expects a stdlib type the class subclasses it too, so
``except PermissionError`` keeps working. The HTTP endpoints answer each of
these with the status ``server/http/http_errors.py`` maps it to. A backend
translates its store's own errors (Redis's ``RedisError``) into
:class:`BackendError` inside ``backends/``; nothing above it names them.
"""

from __future__ import annotations


class SwitchboardError(Exception):
    """Base of every error Switchboard raises on purpose."""


class ConfigError(SwitchboardError, ValueError):
    """A setting (CLI flag or ``SWITCHBOARD_*`` variable) has a bad value."""


class UnsupportedServer(SwitchboardError, RuntimeError):
    """The installed uvicorn or websockets is not a version the server was tested with."""


class ProtocolError(SwitchboardError):
    """A peer sent bytes that break the wire protocol."""


class HandshakeError(ProtocolError):
    """The first frame of a connection was refused.

    ``close_code`` is the WebSocket close code sent after the error frame.
    """

    def __init__(self, message: str, close_code: int = 1008) -> None:
        super().__init__(message)
        self.close_code = close_code


class FrameTooLarge(ProtocolError):
    """A frame or HTTP body above ``max_message_bytes``."""


class EncryptedPayload(ProtocolError):
    """A frame carries a hypha-rpc end-to-end encrypted payload (``_enc``) and the hub refuses them."""


class AuthError(SwitchboardError):
    """A token could not be verified (bad signature, expired, wrong claims)."""


class PermissionDenied(SwitchboardError, PermissionError):
    """The caller is known but not allowed to do this."""


class NotFound(SwitchboardError, KeyError):
    """A workspace, service or function that does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TargetNotConnected(SwitchboardError):
    """A message was addressed to a client that has no live connection."""


class LimitExceeded(SwitchboardError):
    """A per-client or per-workspace quota was hit."""


class RateLimited(LimitExceeded):
    """A caller is over its rate or its calls in flight: retry after ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


#: How every :class:`BackendError` says so: the request may well succeed once retried.
BACKEND_RETRY = "Hub backend unavailable, please retry: "


class BackendError(SwitchboardError):
    """The shared registry or event bus failed; the message begins with :data:`BACKEND_RETRY`, so
    that a client (which sees only the message) can tell a refusal to retry from a final one."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message if message.startswith(BACKEND_RETRY) else f"{BACKEND_RETRY}{message}")


class RequestRefused(SwitchboardError):
    """An HTTP request refused with ``status`` and ``detail``, where no other class says it.

    Raised where the status depends on the step that failed (the same
    ``HandshakeError`` is a 400 when parsed, a 409 when attaching); every other
    error is given its status by ``server/http/http_errors.py``.
    """

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class JsonRpcError(SwitchboardError):
    """A JSON-RPC request (MCP's) answered with an error ``code`` and ``message``, not an HTTP refusal."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message
