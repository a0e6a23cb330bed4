"""Loopback ports for servers the tests start, chosen where no outgoing connection can take them.

A port the kernel hands out for ``bind(0)`` comes from the ephemeral range,
the same range it draws from for the local end of every outgoing connection.
A server started on it later (a replica restarted on its port, as a pod
behind its Service) can find it taken by a client's connection made in
between: "address already in use", seen in the suite. Ports below the
ephemeral range are never given to outgoing connections, so a port that is
free there stays free until someone binds it on purpose.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # well above the ports system services listen on
ATTEMPTS = 200  # random tries below the ephemeral range before falling back to the kernel's choice


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ends of outgoing connections (Linux's default elsewhere)."""
    try:
        low, high = EPHEMERAL_RANGE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999


def bindable(port: int) -> bool:
    """Whether a listener could bind ``port`` on the loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, rng: random.Random | None = None) -> int:
    """A loopback TCP port that is free now and outside the ephemeral range."""
    rng = rng or random.Random()
    low, _ = ephemeral_range()
    if low > LOWEST:
        for _ in range(ATTEMPTS):
            port = rng.randrange(LOWEST, low)
            if bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
