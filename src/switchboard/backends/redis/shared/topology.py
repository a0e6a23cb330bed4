"""A Redis Cluster's slot map, and the decisions drawn from it (pure: no I/O).

The cluster bus reads ``CLUSTER SLOTS`` and asks this module which master a
channel belongs to, which channels must move after a failover or a slot
migration, and which probe channel lands on a given master.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

Address = tuple[str, int]


def address_text(addr: Address) -> str:
    return f"{addr[0]}:{addr[1]}"


def channel_slot(channel: str) -> int:
    return int(key_slot(channel.encode("utf-8", "surrogateescape")))


@dataclass(frozen=True, slots=True)
class Shard:
    """One master, its replicas and the slot ranges it serves."""

    master: Address
    replicas: tuple[Address, ...]
    slots: tuple[tuple[int, int], ...]

    @property
    def slot_count(self) -> int:
        return sum(end - start + 1 for start, end in self.slots)

    def serves(self, slot: int) -> bool:
        return any(start <= slot <= end for start, end in self.slots)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class SlotMap:
    """Which master serves which slot (as one node answered ``CLUSTER SLOTS``)."""

    shards: tuple[Shard, ...]
    _ranges: tuple[tuple[int, int, Address], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ranges = sorted((start, end, s.master) for s in self.shards for start, end in s.slots)
        object.__setattr__(self, "_ranges", tuple(ranges))

    @classmethod
    def parse(cls, raw: Iterable[Any]) -> SlotMap:
        """From a raw RESP2 ``CLUSTER SLOTS`` reply: ``[start, end, [host, port, id], replica...]`` rows."""
        ranges: dict[Address, list[tuple[int, int]]] = {}
        replicas: dict[Address, set[Address]] = {}
        for row in raw:
            start, end, master, *rest = row
            addr = (_text(master[0]), int(master[1]))
            ranges.setdefault(addr, []).append((int(start), int(end)))
            replicas.setdefault(addr, set()).update((_text(r[0]), int(r[1])) for r in rest)
        shards = (Shard(addr, tuple(sorted(replicas[addr])), tuple(sorted(ranges[addr]))) for addr in sorted(ranges))
        return cls(tuple(shards))

    @property
    def masters(self) -> list[Address]:
        return [s.master for s in self.shards]

    @property
    def covered(self) -> int:
        """Slots some master serves (16384 = full coverage)."""
        return sum(s.slot_count for s in self.shards)

    @property
    def complete(self) -> bool:
        return self.covered == REDIS_CLUSTER_HASH_SLOTS

    def shard(self, master: Address) -> Shard | None:
        return next((s for s in self.shards if s.master == master), None)

    def master_of_slot(self, slot: int) -> Address | None:
        ranges = self._ranges
        i = bisect.bisect_right(ranges, (slot, REDIS_CLUSTER_HASH_SLOTS, ("", 0))) - 1
        if i >= 0 and ranges[i][0] <= slot <= ranges[i][1]:
            return ranges[i][2]
        return None

    def master_of(self, channel: str) -> Address | None:
        return self.master_of_slot(channel_slot(channel))


def moves(placement: Mapping[str, Address | None], slot_map: SlotMap) -> list[tuple[str, Address | None, Address]]:
    """``(channel, from, to)`` for every channel whose master changed (``from`` None: not placed yet).

    A channel whose slot no master serves stays where it is until one does.
    """
    out = []
    for channel, current in sorted(placement.items()):
        target = slot_map.master_of(channel)
        if target is not None and target != current:
            out.append((channel, current, target))
    return out


@lru_cache(maxsize=256)  # a pure function's memo: the same few ranges are asked again at every refresh
def tag_for_slot_range(start: int, end: int) -> str:
    """A short hash tag whose slot lies in ``[start, end]``: a channel ``...{tag}`` lands there."""
    for n in itertools.count():
        tag = f"t{n}"
        if start <= key_slot(tag.encode()) <= end:
            return tag
    raise AssertionError("unreachable")  # pragma: no cover


def probe_channel(prefix: str, replica_id: str, shard: Shard) -> str:
    """This replica's probe channel on ``shard``: its slot is one the shard serves."""
    start, end = max(shard.slots, key=lambda r: r[1] - r[0])  # the widest range: found fastest
    return f"{prefix}probe:{replica_id}:{{{tag_for_slot_range(start, end)}}}"


def plan_shards(
    current: Mapping[Address, str], slot_map: SlotMap, replica_id: str, prefix: str = "sb:"
) -> tuple[list[Address], dict[Address, str]]:
    """``(drop, start)``: the shard buses (by master, ``current`` maps each to its probe channel)
    to close, and the masters to start one for, with its probe channel.

    A bus is dropped when its master serves no slot any more (failed, demoted) or when its
    probe channel's slot moved away (it would probe another master); it is started again.
    """
    wanted = {shard.master: probe_channel(prefix, replica_id, shard) for shard in slot_map.shards}
    drop = sorted(addr for addr, probe in current.items() if wanted.get(addr) != probe)
    start = {addr: probe for addr, probe in wanted.items() if addr not in current or addr in drop}
    return drop, start


def slot_map_sources(slot_map: SlotMap | None, down: Iterable[Address], seeds: Iterable[Address]) -> list[Address]:
    """The nodes to ask for ``CLUSTER SLOTS``, in order: the replicas of the masters that are
    ``down`` first (the one promoted knows it at once; the other nodes learn it by gossip, up
    to a few hundred ms later), then the known masters, then the seeds."""
    shards = slot_map.shards if slot_map else ()
    down = set(down)
    standby = [replica for shard in shards if shard.master in down for replica in shard.replicas]
    return list(dict.fromkeys([*standby, *(s.master for s in shards), *seeds]))
