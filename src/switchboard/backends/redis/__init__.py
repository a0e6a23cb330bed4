"""The Redis backend: any number of replicas share one registry and one bus.

:class:`RedisRegistry` keeps service infos (and which replica owns each
client); :class:`RedisBus` delivers bytes between replicas over pub/sub
without ever silently losing a subscription.
"""

from __future__ import annotations

from switchboard.backends.redis.bus.bus import BusStats, RedisBus
from switchboard.backends.redis.bus.subscriptions import SubscriptionSet, missing
from switchboard.backends.redis.shared.breaker import CircuitBreaker, backoff_delay
from switchboard.backends.redis.shared.connection import make_client, pubsub_connection_factory
from switchboard.backends.redis.stores.registry import RedisRegistry

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
