"""The errors the hub's manager answers with: the error's type and message, never its traceback.

hypha-rpc's RPC, which hosts the manager, rejects a call whose function
raised with the formatted traceback: ``_rvalue`` holds it (the function's
exception wrapped in a plain ``Exception`` of its text) and ``_rtrace`` the
wrapper's, or ``_rvalue`` holds the message and ``_rtrace`` the traceback.
Either way it names the hub's install paths, files, lines and source to any
caller. :func:`bare_reject` rewrites such a ``<session>.reject`` frame to
what the hub's own refusals say: ``_rvalue`` the message, ``_rtrace``
``"<type>: <message>"``; the hypha-rpc client raises
``RemoteError:<message>`` followed by that line. Pure functions.
"""

from __future__ import annotations

import re
from typing import Any

import msgpack

from switchboard.errors import ProtocolError
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.payload import payload_map

_FRAME = '  File "'  # how traceback.format_exception starts each frame's lines
_HEADING = "Traceback (most recent call last):"
_RAISED = re.compile(r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?:: (.*))?\Z", re.S)


def exception_only(text: str) -> tuple[str, str]:
    """The type and message of the exception a formatted traceback ends with (the last one raised).

    Frames are the lines from ``  File "`` on with their indented source lines; what follows the
    last of them is ``<type>: <message>``. Text that is no traceback is a message of type ``Exception``.
    """
    lines = text.rstrip("\n").splitlines()
    last = max((i for i, line in enumerate(lines) if line.startswith(_FRAME)), default=None)
    if last is None:  # no frames: at most a heading and its indented lines go
        last = max((i for i, line in enumerate(lines) if line.endswith(_HEADING)), default=None)
    if last is not None:
        last += 1
        while last < len(lines) and lines[last].startswith("    "):
            last += 1  # the frame's source and markers
        lines = lines[last:]
    raised = "\n".join(lines)
    found = _RAISED.match(raised) if raised and not raised[0].isspace() else None
    if found is None or (found.group(2) is None and "\n" in raised):
        return "Exception", raised
    return found.group(1), found.group(2) or ""


def bare_error(error: dict[str, Any]) -> dict[str, Any]:
    """hypha-rpc's encoded error (``{"_rtype": "error", ...}``) as its type and message only."""
    value, trace = error.get("_rvalue"), error.get("_rtrace")
    text = trace if isinstance(trace, str) and _FRAME in trace else value
    if not isinstance(text, str):
        text = str(value)
    kind, message = exception_only(text)
    if kind == "Exception" and message.startswith(_HEADING):  # nothing left but a heading
        message = ""
    return {**error, "_rvalue": message, "_rtrace": f"{kind}: {message}\n" if message else f"{kind}\n"}


def bare_reject(frame: bytes) -> bytes:
    """``frame`` unchanged unless it is a ``<session>.reject`` carrying an error: then with that
    error bare (:func:`bare_error`). Any other frame is passed as it is, undecoded past its header
    (and undecoded at all when its bytes hold no ``.reject``: most of what the manager sends)."""
    if b".reject" not in frame:
        return frame
    try:
        env = envelope.decode(frame)
        method = env.main.get("method")
        if not isinstance(method, str) or not method.endswith(".reject"):
            return frame
        extra = payload_map(env.rest)
    except ProtocolError:
        return frame
    args = extra.get("args")
    if not isinstance(args, list) or not args or not isinstance(args[0], dict) or args[0].get("_rtype") != "error":
        return frame
    extra["args"] = [bare_error(args[0]), *args[1:]]
    return envelope.encode(env.main, msgpack.packb(extra, use_bin_type=True))
