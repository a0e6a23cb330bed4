"""What the client SDK raises, as branches of :class:`switchboard.errors.SwitchboardError`.

::

    SwitchboardError
    ├── GaveUp (ConnectionError)               the reconnect budget ran out: outage_seconds, attempts
    ├── Refused (ConnectionAbortedError)       the hub will not take this client (back): final
    ├── CallInterrupted (ConnectionError)      a call was in flight when the connection dropped
    ├── ClientClosed (ConnectionError)         used after ``disconnect()``: closed by you
    └── SocketClosed (ConnectionError)         one socket ended (internal; classified as retryable)

``GaveUp`` and ``ClientClosed`` separate "broken by the world" from "closed by
you"; both subclass :class:`ConnectionError` so ``except ConnectionError``
written for hypha-rpc keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence

from switchboard.errors import SwitchboardError


class GaveUp(SwitchboardError, ConnectionError):
    """The hub stayed unreachable for the whole ``max_wait`` budget.

    ``outage_seconds`` runs from the first failed attempt of the outage (not
    from the call that noticed it); ``attempts`` counts every dial made.
    """

    def __init__(
        self,
        *,
        outage_seconds: float,
        attempts: int,
        max_wait: float,
        urls: Sequence[str],
        last_error: BaseException | None,
    ) -> None:
        self.outage_seconds = outage_seconds
        self.attempts = attempts
        self.max_wait = max_wait
        self.urls = tuple(urls)
        self.last_error = last_error
        last = f"{type(last_error).__name__}: {last_error}" if last_error else "none"
        super().__init__(
            f"gave up reconnecting to {', '.join(self.urls)} after an outage of "
            f"{outage_seconds:.1f} s and {attempts} attempt{'s' if attempts != 1 else ''} "
            f"(max_wait={max_wait:g} s; last error: {last})"
        )


class Refused(SwitchboardError, ConnectionAbortedError):
    """A refusal retrying cannot fix: an error frame, a 4xx upgrade answer, a bad URL.

    Protocol §2.4: an ``{"type":"error"}`` frame is final (except when the
    close code that follows is 1013, "try again later").
    """

    def __init__(self, message: str, *, url: str = "", close_code: int | None = None) -> None:
        super().__init__(f"{url} refused the connection: {message}" if url else message)
        self.reason = message
        self.url = url
        self.close_code = close_code


class CallInterrupted(SwitchboardError, ConnectionError):
    """The connection dropped while this call was in flight.

    The provider may or may not have run it, so it is not repeated unless the
    provider declared the function idempotent (see :mod:`switchboard.client.calls`).
    """


class ClientClosed(SwitchboardError, ConnectionError):
    """The client was disconnected by its owner; nothing more is sent."""


class SocketClosed(SwitchboardError, ConnectionError):
    """One WebSocket ended, with the close ``code`` (1006: no close frame) and ``reason``.

    ``unsent``: raised by a send that wrote nothing (the socket had already
    ended), so the frame may go out on the next connection as it is.
    """

    def __init__(self, code: int = 1006, reason: str = "", *, unsent: bool = False) -> None:
        super().__init__(f"connection closed (code {code}{': ' + reason if reason else ''})")
        self.code = code
        self.reason = reason
        self.unsent = unsent
