"""``switchboard status``: what each replica last wrote about itself in Redis."""

from __future__ import annotations

import time
from typing import Any

from switchboard.backends.redis import make_client
from switchboard.backends.redis.shared.cluster_setup import CLUSTER_KEY_PREFIX, detect_cluster, make_cluster_client
from switchboard.backends.redis.stores.presence import read_presence


async def read_status(redis_url: str, cluster: bool | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The live replicas' presence records (sorted by id) and the leader lease holder."""
    if detect_cluster(redis_url, cluster):
        client = make_cluster_client(redis_url)
        try:
            return await read_presence(client, CLUSTER_KEY_PREFIX)  # type: ignore[arg-type]  # the same commands
        finally:
            await client.aclose()
    redis = make_client(redis_url)
    try:
        return await read_presence(redis)
    finally:
        await redis.aclose()


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
