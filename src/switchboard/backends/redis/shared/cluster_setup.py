"""Which Redis the URL names (one instance or a cluster), and the clients for a cluster.

``--redis-url`` may list several seed nodes, comma-separated; any one node of
a cluster is enough, the rest are discovered. Whether it is a cluster is
asked of the nodes themselves (``INFO cluster``) unless ``--redis-cluster`` or
``--no-redis-cluster`` says so.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from switchboard.backends.redis.shared.topology import Address
from switchboard.errors import ConfigError

logger = logging.getLogger(__name__)

# Every key of the registry, presence, lease and counters carries this hash tag
# on a cluster: they share one slot, so each multi-key script and transaction
# runs on one master (the message traffic is what spreads: pub/sub is sharded).
CLUSTER_KEY_PREFIX = "{sb}:"
SINGLE_KEY_PREFIX = "sb:"
DETECT_TIMEOUT = 2.0  # seconds per seed node asked whether it is a cluster at start


def seed_urls(url: str) -> list[str]:
    """The comma-separated URLs of ``--redis-url``, each a full ``redis://`` URL."""
    return [part.strip() for part in url.split(",") if part.strip()]


def address_of(url: str) -> Address:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


def node_url(seed: str, addr: Address) -> str:
    """``seed``'s URL (scheme, credentials, options) pointed at another node (database 0)."""
    parts = urlsplit(seed)
    userinfo = parts.netloc.rpartition("@")[0]
    host = f"[{addr[0]}]" if ":" in addr[0] else addr[0]
    netloc = f"{userinfo}@{host}:{addr[1]}" if userinfo else f"{host}:{addr[1]}"
    return urlunsplit((parts.scheme, netloc, "/0", parts.query, ""))


def detect_cluster(url: str, setting: bool | None) -> bool:
    """Whether ``url`` names a cluster: ``setting`` if given, else the first seed that answers says.

    A single seed that nobody answers is taken for one instance (the hub starts
    and keeps retrying, as it always did); several seeds can only be a cluster.
    """
    seeds = seed_urls(url)
    if setting is not None:
        if not setting and len(seeds) > 1:
            raise ConfigError("--no-redis-cluster with several --redis-url seeds: give one URL, or drop the flag")
        return setting
    for seed in seeds:
        try:
            with redis.Redis.from_url(
                seed, socket_timeout=DETECT_TIMEOUT, socket_connect_timeout=DETECT_TIMEOUT, protocol=2
            ) as probe:
                enabled = bool(probe.info("cluster").get("cluster_enabled"))
        except (RedisError, OSError) as exc:
            logger.warning("cannot ask %s whether it is a cluster: %s", address_of(seed), exc)
            continue
        logger.info("redis at %s: %s", address_of(seed), "a cluster" if enabled else "one instance")
        return enabled
    if len(seeds) > 1:
        return True
    logger.warning(
        "no Redis answered: assuming one instance (set --redis-cluster or --no-redis-cluster to skip the question)"
    )
    return False


def make_cluster_client(url: str, *, timeout: float = 2.0, max_connections: int = 64) -> RedisCluster:
    """A command client for the cluster: RESP2, bounded timeouts, slot map refreshed on MOVED and on errors,
    at most ``max_connections`` connections to each node.

    Retries are redis-py's (on connection errors and timeouts, reading the slot
    map again between tries): on a cluster a command that timed out on a
    failed master is retried on its promoted replica.
    """
    seeds = seed_urls(url)
    first = urlsplit(seeds[0])
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 3, (RedisConnectionError, RedisTimeoutError))
    return RedisCluster(
        startup_nodes=[ClusterNode(*address_of(seed)) for seed in seeds],
        protocol=2,
        username=first.username,
        password=first.password,
        ssl=first.scheme == "rediss",
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=retry,
        max_connections=max_connections,
    )
