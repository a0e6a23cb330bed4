"""The Redis backend: any number of replicas share one registry and one bus.

:class:`RedisRegistry` keeps service infos (and which replica owns each
client); :class:`RedisBus` delivers bytes between replicas over pub/sub
without ever silently losing a subscription.
"""

from __future__ import annotations

from switchboard.backends.redis.breaker import CircuitBreaker, backoff_delay
from switchboard.backends.redis.bus import BusStats, RedisBus
from switchboard.backends.redis.connection import make_client, pubsub_connection_factory
from switchboard.backends.redis.registry import RedisRegistry
from switchboard.backends.redis.subscriptions import SubscriptionSet, missing

__all__ = [
    "BusStats",
    "CircuitBreaker",
    "RedisBus",
    "RedisRegistry",
    "SubscriptionSet",
    "backoff_delay",
    "make_client",
    "missing",
    "pubsub_connection_factory",
]
