"""The start-up check: refuse to serve on a uvicorn or websockets the hub was not tested with.

The hub reaches both through their public interfaces only, but two of those
are contracts that hold by convention rather than by documentation: how
uvicorn hands an upgraded connection to the class given as ``ws=`` (keyword
arguments ``config``, ``server_state``, ``app_state``, then ``connection_made``
and ``data_received`` with the request head), and the httptools protocol that
:class:`~switchboard.server.http.http_protocol.HubHttpProtocol` extends (its parser
callbacks). A release that changed either would fail at the first client, or
subtly; so the server refuses to start on an untested one, and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

from switchboard.errors import UnsupportedServer

#: package -> (lowest tested, first untested): half-open ranges of release numbers
TESTED: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "uvicorn": ((0, 54, 0), (0, 55)),
    "websockets": ((17, 0), (18,)),
}


def installed() -> dict[str, str]:
    return {name: metadata.version(name) for name in TESTED}


def check(versions: Mapping[str, str] | None = None) -> None:
    """Raise :class:`~switchboard.errors.UnsupportedServer` unless every version is in its tested range."""
    for name, version in (versions or installed()).items():
        low, high = TESTED[name]
        release = _release(version)
        if release is None or not low <= release < high:
            raise UnsupportedServer(
                f"{name} {version} is not a version Switchboard was tested with "
                f"({_dotted(low)} or later, before {_dotted(high)}): the hub's WebSocket and HTTP protocols "
                f"plug into it by contracts only those versions are known to keep. "
                f"Install the pinned version (pyproject.toml), e.g. pip install '{name}>={_dotted(low)},<{_dotted(high)}'."
            )


def _release(version: str) -> tuple[int, ...] | None:
    """``"0.54.0"`` -> ``(0, 54, 0)``; a pre-release or local suffix ends the numbers."""
    numbers = []
    for part in version.split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    return tuple(numbers) or None


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))
