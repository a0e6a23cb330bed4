"""Test helpers: the fake clock, real Valkey server and fault-injecting proxy
that Switchboard's own test suite uses, published so that applications built
on Switchboard can test their failure handling the same way."""

from __future__ import annotations

from switchboard.testing.clock import FakeClock
from switchboard.testing.proxy import (
    ConnectionInfo,
    FaultProxy,
    ProxyConnection,
    ProxyStats,
    ThreadedFaultProxy,
)
from switchboard.testing.valkey import ValkeyServer, ValkeyServerError, find_server_binary

__all__ = [
    "ConnectionInfo",
    "FakeClock",
    "FaultProxy",
    "ProxyConnection",
    "ProxyStats",
    "ThreadedFaultProxy",
    "ValkeyServer",
    "ValkeyServerError",
    "find_server_binary",
]
