"""Switchboard's Python client: hypha-rpc's RPC engine on a transport that rides out restarts.

::

    from switchboard.client import connect

    client = await connect(["http://replica-a:9527", "http://replica-b:9527"])
    await client.register_service({"id": "calc", "add": lambda a, b: a + b})

Everything hypha-rpc offers (services, callbacks, generators, events) works
unchanged; underneath, reconnection follows :class:`ReconnectPolicy`: a
wall-clock budget from the first failed attempt, capped jittered backoff,
rotation across URLs and an immediate switch when a server says it is
restarting (close 1012/1001).
"""

from switchboard.client.calls import RemoteCall, idempotent
from switchboard.client.connect import Client, connect
from switchboard.client.errors import CallInterrupted, ClientClosed, GaveUp, Refused
from switchboard.client.events import (
    Disconnected,
    Event,
    EventHandler,
    GivingUp,
    Reconnected,
    Reconnecting,
    Rejoined,
)
from switchboard.client.policy import Jitter, Outage, ReconnectPolicy, classify
from switchboard.client.transport import State, Transport

__all__ = [
    "CallInterrupted",
    "Client",
    "ClientClosed",
    "Disconnected",
    "Event",
    "EventHandler",
    "GaveUp",
    "GivingUp",
    "Jitter",
    "Outage",
    "Reconnected",
    "Reconnecting",
    "ReconnectPolicy",
    "Refused",
    "Rejoined",
    "RemoteCall",
    "State",
    "Transport",
    "classify",
    "connect",
    "idempotent",
]
