"""The manager's errors leave as type and message: what is kept and what goes of a formatted traceback."""

from __future__ import annotations

import traceback

import msgpack
import pytest
from hypha_rpc.utils import format_traceback

from switchboard.errors import PermissionDenied
from switchboard.protocol.hypha.envelope import encode
from switchboard.protocol.hypha.remote_errors import bare_error, bare_reject, exception_only


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _chained() -> BaseException:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise PermissionDenied("Permission denied for workspace W") from inner
    except PermissionDenied as outer:
        return outer


def _formatted(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def rpc_shape(exc: BaseException) -> dict[str, object]:
    """What hypha-rpc's RPC sends when a function raised: the traceback, wrapped in an ``Exception``."""
    wrapped = Exception(format_traceback(_formatted(exc)))
    return {"_rtype": "error", "_rvalue": str(wrapped), "_rtrace": _formatted(wrapped)}


def encoded_shape(exc: BaseException) -> dict[str, object]:
    """What hypha-rpc sends when it encodes a raised exception itself: the message, then the traceback."""
    return {"_rtype": "error", "_rvalue": str(exc), "_rtrace": _formatted(exc)}


@pytest.mark.parametrize("shape", [rpc_shape, encoded_shape], ids=["rpc", "encoded"])
@pytest.mark.parametrize(
    ("exc", "kind", "message"),
    [
        (_raised(PermissionDenied("Permission denied for workspace W")), "switchboard.errors.PermissionDenied", None),
        (_raised(TypeError("f() got multiple values for argument 'context'")), "TypeError", None),
        (_raised(ValueError("two\nlines")), "ValueError", "two\nlines"),
        (_chained(), "switchboard.errors.PermissionDenied", "Permission denied for workspace W"),
        (_raised(RuntimeError()), "RuntimeError", ""),
    ],
    ids=["hub-error", "builtin", "two-lines", "chained", "no-message"],
)
def test_an_error_keeps_its_type_and_message_and_loses_every_frame(shape, exc, kind, message) -> None:
    bare = bare_error(shape(exc))
    expected = str(exc) if message is None else message
    assert bare["_rvalue"] == expected
    assert bare["_rtrace"] == (f"{kind}: {expected}\n" if expected else f"{kind}\n")
    assert 'File "' not in repr(bare)
    assert "Traceback" not in repr(bare)


def test_text_that_is_no_traceback_is_a_message() -> None:
    assert exception_only("Service not found: W/x:y") == ("Exception", "Service not found: W/x:y")
    assert exception_only("KeyError: 'k'") == ("KeyError", "'k'")


def test_a_reject_frame_is_rewritten_and_any_other_frame_passes_untouched() -> None:
    error = rpc_shape(_raised(PermissionDenied("Permission denied for workspace W")))
    reject = encode(
        {"type": "method", "to": "W/c", "method": "s1.reject"},
        msgpack.packb({"args": [error], "with_kwargs": False}),
    )
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(bare_reject(reject))
    main, extra = list(unpacker)
    assert main == {"type": "method", "to": "W/c", "method": "s1.reject"}
    assert extra["args"][0]["_rvalue"] == "Permission denied for workspace W"
    assert extra["with_kwargs"] is False

    resolve = encode({"type": "method", "to": "W/c", "method": "s1.resolve"}, msgpack.packb({"args": [error]}))
    plain = encode({"type": "method", "to": "W/c", "method": "s1.reject"}, msgpack.packb({"args": ["text"]}))
    for frame in (resolve, plain, b"\x01not a frame"):
        assert bare_reject(frame) is frame
