"""What ``GET /health`` answers: Switchboard's readiness, with Hypha's diagnostic fields beside it.

Hypha 0.21.137's ``/health`` reports memory, connection and object counts,
tasks, the host's load and a score; monitoring written against it reads
those fields. :func:`report` builds the answer from :class:`HealthFacts`
(pure: tests give it facts), :func:`measure` reads them from the process and
the host (``/proc`` on Linux; elsewhere the memory fields are ``null``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

MB = 1024 * 1024
# Hypha's thresholds: above them the score drops and an issue is named, the status stays the same.
HIGH_RSS_BYTES = 2 * 1024 * MB
HIGH_TASKS = 1000


@dataclass(frozen=True)
class HealthFacts:
    ready: bool
    why: str  # readiness's reason ("ready", "draining", "event bus: ...")
    replica: str
    connections: int
    services: int  # registered by this replica's clients
    tasks: int  # asyncio tasks not done
    uptime: float  # seconds since the process started serving
    rss: int | None  # bytes; None where the process cannot tell
    vms: int | None
    memory_percent: float | None  # of the host's memory in use
    load_average: tuple[float, float, float] | None
    disk_percent: float | None  # of the root file system in use
    now: float  # epoch seconds


def report(facts: HealthFacts) -> tuple[int, dict[str, Any]]:
    """The status code and body: 200 with ``HEALTHY`` while the replica serves, else 503 with ``DOWN``."""
    score = 100 if facts.ready else 0
    issues = [] if facts.ready else [facts.why]
    if facts.rss is not None and facts.rss > HIGH_RSS_BYTES:
        score -= 20
        issues.append("High memory usage (>2GB)")
    if facts.tasks > HIGH_TASKS:
        score -= 15
        issues.append(f"High active task count ({facts.tasks})")
    body: dict[str, Any] = {
        "status": "HEALTHY" if facts.ready else "DOWN",
        "detail": facts.why,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(facts.now)),
        "replica": facts.replica,
        "health_score": max(0, score),
        "issues": issues,
        "memory": {
            "rss_mb": _mb(facts.rss),
            "vms_mb": _mb(facts.vms),
            "percent": facts.memory_percent,
        },
        "connections": {"active": facts.connections},
        "objects": {"rpc_objects": facts.services, "connection_objects": facts.connections},
        "tasks": {"active": facts.tasks},
        "system": {
            "memory_percent": facts.memory_percent,
            "disk_usage": facts.disk_percent,
            "load_average": list(facts.load_average) if facts.load_average else None,
        },
        "uptime_seconds": round(facts.uptime, 2),
    }
    return (200 if facts.ready else 503), body


def _mb(size: int | None) -> float | None:
    return None if size is None else round(size / MB, 2)


def measure(*, ready: bool, why: str, replica: str, connections: int, services: int, started: float) -> HealthFacts:
    """The facts of this process and host now (a few small ``/proc`` reads)."""
    rss, vms = _process_memory()
    try:
        load: tuple[float, float, float] | None = os.getloadavg()
    except OSError:
        load = None
    try:
        disk = shutil.disk_usage("/")
        disk_percent: float | None = round(100 * disk.used / disk.total, 1) if disk.total else None
    except OSError:
        disk_percent = None
    return HealthFacts(
        ready=ready,
        why=why,
        replica=replica,
        connections=connections,
        services=services,
        tasks=sum(1 for t in asyncio.all_tasks() if not t.done()),
        uptime=time.monotonic() - started,
        rss=rss,
        vms=vms,
        memory_percent=_host_memory_percent(),
        load_average=load,
        disk_percent=disk_percent,
        now=time.time(),
    )


def _process_memory() -> tuple[int | None, int | None]:
    """(resident, virtual) bytes of this process, from ``/proc/self/statm``."""
    try:
        with open("/proc/self/statm") as f:
            pages = f.read().split()
    except OSError:
        return None, None
    page = os.sysconf("SC_PAGE_SIZE")
    return int(pages[1]) * page, int(pages[0]) * page


def _host_memory_percent() -> float | None:
    """The share of the host's memory in use (total less available), from ``/proc/meminfo``."""
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) for line in f if line.count(" ") >= 1}
    except (OSError, ValueError, IndexError):
        return None
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    if not total or available is None:
        return None
    return round(100 * (total - available) / total, 1)
