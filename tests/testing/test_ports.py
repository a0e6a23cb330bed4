"""Ports for the servers the tests start: never where an outgoing connection can take them."""

from __future__ import annotations

import random
import socket

from switchboard.testing.ports import LOWEST, ephemeral_range, free_port
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.valkey import ValkeyServer


def test_a_free_port_is_below_the_range_outgoing_connections_draw_from_and_can_be_bound():
    low, _ = ephemeral_range()
    for seed in range(50):
        port = free_port(rng=random.Random(seed))
        assert LOWEST <= port < low, port
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_handed_out():
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port(rng=random.Random(7))))
        taken = held.getsockname()[1]
        assert free_port(rng=random.Random(7)) != taken  # the same draw, told it is taken


def test_replicas_and_valkey_servers_get_their_ports_there():
    low, _ = ephemeral_range()
    assert ReplicaProcess(replica_id="ports").port < low
    assert ValkeyServer().port < low
