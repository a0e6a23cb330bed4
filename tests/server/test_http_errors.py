"""The HTTP endpoints' one table from errors to statuses, and how a provider's error is classified."""

from __future__ import annotations

import traceback

import pytest
from hypha_rpc.rpc import RemoteException
from hypha_rpc.utils import format_traceback

from switchboard.errors import (
    AuthError,
    BackendError,
    FrameTooLarge,
    HandshakeError,
    NotFound,
    PermissionDenied,
    RequestRefused,
)
from switchboard.server.http.http_errors import remote_error_type, status_of


@pytest.mark.parametrize(
    ("exc", "status", "detail"),
    [
        (RequestRefused(409, "taken"), 409, "taken"),
        (NotFound("no svc"), 404, "KeyError: no svc"),
        (PermissionDenied("no"), 403, "PermissionError: no"),
        (AuthError("expired"), 401, "Authentication error: expired"),
        (FrameTooLarge("too big"), 413, "too big"),
        (HandshakeError("bad hello"), 400, "ValueError: bad hello"),  # any ProtocolError
        (BackendError("redis down"), 503, "Hub backend unavailable, please retry: redis down"),
        (TimeoutError(), 504, "TimeoutError: the service did not answer in time"),
        (RuntimeError("bug"), 500, "RuntimeError: bug"),
    ],
)
def test_each_error_class_has_one_status(exc: BaseException, status: int, detail: str) -> None:
    assert status_of(exc) == (status, detail)


def python_provider_error(exc: BaseException) -> RemoteException:
    """What a hypha-rpc caller holds when a Python provider raised ``exc``.

    The provider rejects with ``Exception(format_traceback(...))``; its encoding
    sends the message and the formatted exception; the caller joins them.
    """
    try:
        raise exc
    except BaseException:
        wrapped = Exception(format_traceback(traceback.format_exc()))
    trace = "".join(traceback.format_exception(type(wrapped), value=wrapped, tb=wrapped.__traceback__))
    return RemoteException("RemoteError:" + str(wrapped) + "\n" + trace)


def javascript_provider_error(name: str, message: str) -> RemoteException:
    """What a hypha-rpc caller holds when a JavaScript provider threw: ``String(e)`` and ``e.stack``."""
    stack = f"{name}: {message}\n    at add (agent.mjs:10:5)\n    at RPC.handle (hypha-rpc.js:900:3)"
    return RemoteException(f"RemoteError:{name}: {message}\n{stack}")


def test_the_type_a_python_provider_raised_is_read_from_its_traceback() -> None:
    assert remote_error_type(python_provider_error(ValueError("b must be positive"))) == "ValueError"
    assert remote_error_type(python_provider_error(PermissionError("no"))) == "PermissionError"


def test_the_type_a_javascript_provider_threw_is_read_from_its_stack() -> None:
    assert remote_error_type(javascript_provider_error("TypeError", "x is not a function")) == "TypeError"


def test_of_chained_exceptions_the_one_raised_last_counts() -> None:
    try:
        try:
            raise PermissionError("inner")
        except PermissionError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as outer:
        error = python_provider_error(outer)
    assert "PermissionError" in str(error)
    assert remote_error_type(error) == "RuntimeError"
    assert status_of(error)[0] == 500


def test_a_message_that_merely_mentions_a_type_does_not_change_the_status() -> None:
    error = python_provider_error(RuntimeError("could not raise PermissionError here"))
    assert status_of(error)[0] == 500


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (PermissionError("no"), 403),
        (TypeError("add() got an unexpected keyword argument 'c'"), 400),
        (ValueError("bad"), 400),
        (AssertionError("bad"), 400),
        (KeyError("k"), 500),
        (RuntimeError("bug"), 500),
    ],
)
def test_a_provider_error_is_the_callers_fault_only_for_a_few_types(exc: BaseException, status: int) -> None:
    error = python_provider_error(exc)
    assert status_of(error) == (status, f"RemoteException: {error}")


def test_a_text_naming_no_type_is_the_providers_fault() -> None:
    assert remote_error_type(RemoteException("RemoteError:it broke")) is None
    assert status_of(RemoteException("RemoteError:it broke"))[0] == 500
