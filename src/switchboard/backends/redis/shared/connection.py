"""Redis clients with explicit timeouts and retries.

redis-py retries silently by default (and its PubSub resubscribes behind the
caller's back); Switchboard wants every retry to be a decision it made:

* command clients retry once, only on ``ConnectionError``, so a pooled socket
  left stale by a Redis restart is replaced transparently, but a timeout (the
  command may have run) is never repeated;
* the pub/sub connection never retries or reconnects by itself: the bus owns
  reconnecting and re-wiring, so it always knows what is really subscribed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.connection import AbstractConnection, Connection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from switchboard.backends.redis.shared.patient import patient_client

PubSubConnectionFactory = Callable[[], AbstractConnection]


# Commands that find every pooled connection busy wait for one (up to the
# command timeout) instead of failing: a burst of thousands of disconnects must
# queue, not turn into "Too many connections" errors and lost clean-ups
# (config.py's redis_max_connections, whose default this is).
POOL_SIZE = 64

# The leader lease's loop and the presence record's loop, one command at a time each: a connection
# of their own each, so neither ever waits for a pooled one behind the clients' commands.
LIVENESS_CONNECTIONS = 2


def make_client(
    url: str, *, timeout: float = 2.0, retries: int = 1, max_connections: int = POOL_SIZE, **kwargs: Any
) -> aredis.Redis:
    """A command client: RESP2, bounded socket timeouts, ``retries`` on ConnectionError only,
    and a blocking pool of ``max_connections`` connections."""
    kwargs.setdefault("protocol", 2)
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), retries, (RedisConnectionError,))
    pool = aredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout,
        retry=retry,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        **kwargs,
    )
    return patient_client(pool)  # owns (and closes) its pool; a client's request waits only while Redis answers


def client_name(replica_id: str, role: str) -> str:
    """A CLIENT SETNAME-safe name, so operators can spot a replica's connections."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"sb-{role}-{replica_id}")[:100]


def pubsub_connection_factory(url: str, *, timeout: float = 2.0, name: str | None = None) -> PubSubConnectionFactory:
    """Makes unconnected RESP2 connections that never retry or reconnect on their own.

    ``timeout`` bounds connecting and the handshake; reads on the connection
    block without a timeout (silence is detected by the bus's probe).
    """
    kwargs: dict[str, Any] = dict(parse_url(url))
    cls: type[AbstractConnection] = kwargs.pop("connection_class", Connection)

    def make() -> AbstractConnection:
        return cls(
            **kwargs,
            protocol=2,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            client_name=name,
        )

    return make


def resolve_source(
    source: str | PubSubConnectionFactory,
    publisher: aredis.Redis | None,
    *,
    timeout: float,
    name: str,
) -> tuple[PubSubConnectionFactory, aredis.Redis, bool]:
    """A bus's pub/sub factory and publisher, and whether the publisher is ours to close."""
    if isinstance(source, str):
        factory = pubsub_connection_factory(source, timeout=timeout, name=name)
        if publisher is None:
            return factory, make_client(source, timeout=timeout), True
        return factory, publisher, False
    if publisher is None:
        raise ValueError("a connection factory needs an explicit publisher client")
    return source, publisher, False
