"""Plain pub/sub (one Redis) or sharded pub/sub (one master of a cluster): what differs.

The bus speaks either; only the command names, the reply kinds, how channels
are batched and how a message is published change.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.crc import key_slot

BATCH = 200  # channels per SUBSCRIBE command when re-wiring

# Sharded pub/sub answers with its own reply kinds; the bus reads them as the plain ones.
_PLAIN_KIND = {b"smessage": b"message", b"ssubscribe": b"subscribe", b"sunsubscribe": b"unsubscribe"}


@dataclass(frozen=True, slots=True)
class PubSubDialect:
    sharded: bool = False

    @property
    def subscribe(self) -> str:
        return "SSUBSCRIBE" if self.sharded else "SUBSCRIBE"

    @property
    def unsubscribe(self) -> str:
        return "SUNSUBSCRIBE" if self.sharded else "UNSUBSCRIBE"

    @staticmethod
    def kind(raw: bytes) -> bytes:
        """A reply's kind as plain pub/sub names it."""
        return _PLAIN_KIND.get(raw, raw)

    def batches(self, channels: list[str]) -> list[list[str]]:
        """SUBSCRIBE batches; an SSUBSCRIBE's channels must share one slot."""
        if not self.sharded:
            return [channels[i : i + BATCH] for i in range(0, len(channels), BATCH)]
        by_slot: dict[int, list[str]] = {}
        for channel in channels:
            by_slot.setdefault(key_slot(channel.encode("utf-8", "surrogateescape")), []).append(channel)
        return [group[i : i + BATCH] for group in by_slot.values() for i in range(0, len(group), BATCH)]

    @property
    def publish(self) -> str:
        """PUBLISH, or SPUBLISH on a cluster's master (its count is that shard's, exactly)."""
        return "SPUBLISH" if self.sharded else "PUBLISH"
