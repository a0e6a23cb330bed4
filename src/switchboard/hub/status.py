"""``switchboard status``: what each replica last wrote about itself in Redis."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from switchboard.backends.redis import make_client
from switchboard.hub.cluster import LEADER_KEY, PRESENCE_PREFIX, REPLICAS_KEY

if TYPE_CHECKING:
    import redis.asyncio as aredis


async def read_status(redis_url: str) -> tuple[list[dict[str, Any]], str | None]:
    """The live replicas' presence records (sorted by id) and the leader lease holder."""
    redis = make_client(redis_url)
    try:
        return await read_presence(redis)
    finally:
        await redis.aclose()


async def read_presence(redis: aredis.Redis) -> tuple[list[dict[str, Any]], str | None]:
    """:func:`read_status` on a client already open (one pipelined round trip per step)."""
    members = sorted(_text(m) for m in await redis.smembers(REPLICAS_KEY))
    async with redis.pipeline(transaction=False) as pipe:
        for member in members:
            pipe.hgetall(PRESENCE_PREFIX + member)
        pipe.get(LEADER_KEY)
        *raws, holder = await pipe.execute()
    # a replica whose presence expired is gone
    replicas = [{k.decode(): v.decode() for k, v in raw.items()} for raw in raws if raw]
    leader = holder.decode().partition("#")[0] if holder else None
    return sorted(replicas, key=lambda r: r.get("id", "")), leader


def _text(value: bytes | str) -> str:
    """A Redis reply as text (the client is made without decode_responses: bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def render_table(replicas: list[dict[str, Any]], leader: str | None, now: float | None = None) -> str:
    now = time.time() if now is None else now
    header = ("REPLICA", "ADDRESS", "AGE", "CLIENTS", "LEADER", "SUBSCRIPTIONS", "BUS")
    rows = [header]
    for r in replicas:
        age = now - float(r.get("started", now))
        subs = f"{r.get('confirmed', '?')}/{r.get('desired', '?')} confirmed"
        rows.append(
            (
                r.get("id", "?"),
                r.get("address", "?"),
                _age(age),
                r.get("clients", "?"),
                "yes" if r.get("id") == leader else "",
                subs,
                r.get("bus", "?"),
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.append(f"{len(replicas)} replicas; leader: {leader or 'none'}")
    return "\n".join(lines)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"
