"""What this replica wants subscribed versus what Redis has acknowledged.

The two sets are kept apart on purpose: a replica that records a subscription
as done before Redis confirmed it, and then guards later attempts with that
record, turns one lost SUBSCRIBE into a permanent black hole. Every guard here
tests ``confirmed``; ``desired`` only ever shrinks on an explicit unsubscribe.
Pure bookkeeping, no I/O, so it can be tested synchronously.
"""

from __future__ import annotations

from collections.abc import Iterable


def missing(desired: Iterable[str], confirmed: Iterable[str]) -> list[str]:
    """The channels still to wire: ``desired - confirmed``, sorted (stable batches, logs)."""
    return sorted(set(desired).difference(confirmed))


class SubscriptionSet:
    """Desired channels and the subset confirmed on the live pub/sub connection."""

    def __init__(self) -> None:
        self.desired: set[str] = set()
        self.confirmed: set[str] = set()

    def want(self, channel: str) -> bool:
        """Add ``channel`` to desired; True if it still needs wiring (not confirmed)."""
        self.desired.add(channel)
        return channel not in self.confirmed

    def drop(self, channel: str) -> None:
        """An explicit unsubscribe: the only way a channel leaves ``desired``."""
        self.desired.discard(channel)
        self.confirmed.discard(channel)

    def on_confirmed(self, channel: str) -> bool:
        """Redis acknowledged SUBSCRIBE on the live connection; False if no longer desired."""
        if channel not in self.desired:
            return False
        self.confirmed.add(channel)
        return True

    def on_unsubscribed(self, channel: str) -> None:
        """Redis acknowledged UNSUBSCRIBE: the channel is no longer wired."""
        self.confirmed.discard(channel)

    def on_connection_lost(self) -> None:
        """Subscriptions live on a connection: a new one starts with none confirmed."""
        self.confirmed.clear()

    def is_confirmed(self, channel: str) -> bool:
        return channel in self.confirmed

    def missing(self) -> list[str]:
        return missing(self.desired, self.confirmed)

    def unconfirmed(self) -> int:
        """How many desired channels are not confirmed, without listing them: the readiness check
        runs before every WebSocket upgrade, and a replica desires a channel per client
        (``confirmed`` only ever holds desired channels, see :meth:`on_confirmed`)."""
        return len(self.desired) - len(self.confirmed)

    def __repr__(self) -> str:
        return f"SubscriptionSet(desired={len(self.desired)}, confirmed={len(self.confirmed)})"
