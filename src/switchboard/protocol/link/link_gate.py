"""Who may start a link handshake, and how refused ones are reported: decisions without I/O.

Anyone who can reach a replica's link port can open connections to it. Each
one the listener takes costs a socket, a random challenge and a handshake
deadline, and each one that never proves itself would cost a warning line
(400 silent connections once wrote 415). So the listener takes at most
:data:`MAX_PENDING_PER_ADDRESS` unfinished handshakes from one address, and
at most ``--max-link-handshakes`` from all addresses together (66 loopback
addresses once held 1,056 and took every descriptor of a replica limited to
1,024, so clients could not connect); none at all while the process has
fewer than :data:`DESCRIPTOR_RESERVE` descriptors to spare (RLIMIT_NOFILE),
which are kept for clients. The rest are closed at once, unanswered; and
refusals are logged at most once per :data:`REFUSAL_LOG_INTERVAL`: the first
at once, the rest as one count.
"""

from __future__ import annotations

# A replica dials another only when it has no link to it, one dial at a time
# (``replicas/dataplane/links.py``), so one address has as many handshakes in flight as
# replicas behind it (one machine, or one NAT). 16 lets that many replicas
# link at once; more unfinished handshakes from one address are not replicas
# dialling, and each would hold a socket until its deadline (3 s).
MAX_PENDING_PER_ADDRESS = 16
# The default of --max-link-handshakes (config.py says why).
MAX_PENDING = 64
# Descriptors a replica keeps for clients: with fewer than this many left below its
# RLIMIT_NOFILE it takes no link handshake (a replica that needs a link then sends
# through Redis). 256 covers the replica's own (its Redis pools, its links, its logs)
# and a burst of clients arriving, whatever the link port is sent.
DESCRIPTOR_RESERVE = 256
# At most one warning line per this many seconds about refused handshakes:
# enough to see an attack or a misconfigured replica (with the count, and the
# last reason and address), too few to fill the log.
REFUSAL_LOG_INTERVAL = 10.0


class HandshakeGate:
    """Unfinished handshakes: at most ``per_address`` from each source address, ``total`` from all."""

    def __init__(
        self,
        per_address: int = MAX_PENDING_PER_ADDRESS,
        total: int = MAX_PENDING,
        reserve: int = DESCRIPTOR_RESERVE,
    ) -> None:
        self.per_address = per_address
        self.total = total
        self.reserve = reserve
        self._pending: dict[str, int] = {}
        self._count = 0

    def admit(self, address: str) -> bool:
        """Take a connection from ``address`` (``True``; call :meth:`release` once it is done)."""
        return self.refusal(address) is None

    def has_room(self, address: str) -> bool:
        """Whether a connection from ``address`` fits the counts (before descriptors are counted)."""
        return self._count < self.total and self._pending.get(address, 0) < self.per_address

    def refusal(self, address: str, descriptors: tuple[int, int] | None = None) -> str | None:
        """Why a connection from ``address`` is turned away, or ``None``: taken (:meth:`release` it
        once done). ``descriptors``: the process's open descriptors and their limit, if known."""
        if self._count >= self.total:
            return f"{self.total} unfinished handshakes already (--max-link-handshakes)"
        held = self._pending.get(address, 0)
        if held >= self.per_address:
            return "too many unfinished handshakes from this address already"
        if descriptors is not None and descriptors[0] >= descriptors[1] - self.reserve:
            return (
                f"{descriptors[0]} of {descriptors[1]} file descriptors open, the last {self.reserve} kept for clients"
            )
        self._pending[address] = held + 1
        self._count += 1
        return None

    def release(self, address: str) -> None:
        """A handshake :meth:`admit` took is over: proven, refused or its connection lost."""
        held = self._pending.get(address, 0)
        if held > 1:
            self._pending[address] = held - 1
        elif held == 1:
            del self._pending[address]
        if held > 0:
            self._count -= 1

    @property
    def pending(self) -> int:
        return self._count

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
