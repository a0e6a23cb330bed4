"""Who may start a link handshake, and how refused ones are reported: decisions without I/O.

Anyone who can reach a replica's link port can open connections to it. Each
one the listener takes costs a socket, a random challenge and a handshake
deadline, and each one that never proves itself would cost a warning line
(400 silent connections once wrote 415). So the listener takes at most
:data:`MAX_PENDING_PER_ADDRESS` unfinished handshakes from one address and
closes the rest at once, unanswered; and refusals are logged at most once
per :data:`REFUSAL_LOG_INTERVAL`: the first at once, the rest as one count.
"""

from __future__ import annotations

# A replica dials another only when it has no link to it, one dial at a time
# (``replicas/links.py``), so one address has as many handshakes in flight as
# replicas behind it (one machine, or one NAT). 16 lets that many replicas
# link at once; more unfinished handshakes from one address are not replicas
# dialling, and each would hold a socket until its deadline (3 s).
MAX_PENDING_PER_ADDRESS = 16
# At most one warning line per this many seconds about refused handshakes:
# enough to see an attack or a misconfigured replica (with the count, and the
# last reason and address), too few to fill the log.
REFUSAL_LOG_INTERVAL = 10.0


class HandshakeGate:
    """Unfinished handshakes per source address, at most ``per_address`` each."""

    def __init__(self, per_address: int = MAX_PENDING_PER_ADDRESS) -> None:
        self.per_address = per_address
        self._pending: dict[str, int] = {}

    def admit(self, address: str) -> bool:
        """Take a connection from ``address`` (``True``; call :meth:`release` once it is done)."""
        held = self._pending.get(address, 0)
        if held >= self.per_address:
            return False
        self._pending[address] = held + 1
        return True

    def release(self, address: str) -> None:
        """A handshake :meth:`admit` took is over: proven, refused or its connection lost."""
        held = self._pending.get(address, 0) - 1
        if held > 0:
            self._pending[address] = held
        else:
            self._pending.pop(address, None)

    @property
    def pending(self) -> int:
        return sum(self._pending.values())

    def pending_from(self, address: str) -> int:
        return self._pending.get(address, 0)


class RefusalLog:
    """The lines to log about refused handshakes: at most one per ``interval``, none lost from the count."""

    def __init__(self, interval: float = REFUSAL_LOG_INTERVAL) -> None:
        self.interval = interval
        self._quiet_until = float("-inf")
        self._count = 0  # refusals since the last line
        self._last = ""

    def refused(self, now: float, what: str) -> str | None:
        """A handshake was refused (``what``: from where, and why): the line to log now, if any."""
        self._count += 1
        self._last = what
        return self.due(now)

    def due(self, now: float) -> str | None:
        """The line that is due at ``now`` (the heartbeat asks), if refusals are waiting for one."""
        if not self._count or now < self._quiet_until:
            return None
        count, self._count = self._count, 0
        self._quiet_until = now + self.interval
        if count == 1:
            return f"link handshake refused {self._last}"
        return f"{count} link handshakes refused in the last {self.interval:g} s; the last {self._last}"
