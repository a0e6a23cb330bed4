"""``/health``'s answer from given facts (no process or host read)."""

from __future__ import annotations

from dataclasses import replace

from switchboard.server.http.health_report import MB, HealthFacts, report

FACTS = HealthFacts(
    ready=True,
    why="ready",
    replica="r1",
    connections=3,
    services=7,
    tasks=40,
    uptime=12.345,
    rss=100 * MB,
    vms=300 * MB,
    memory_percent=41.5,
    load_average=(0.5, 0.25, 0.125),
    disk_percent=63.0,
    now=0.0,
)


def test_a_serving_replica_is_healthy_with_hyphas_fields():
    status, body = report(FACTS)
    assert status == 200
    assert body["status"] == "HEALTHY"
    assert body["health_score"] == 100
    assert body["issues"] == []
    assert body["timestamp"] == "1970-01-01T00:00:00Z"
    assert body["memory"] == {"rss_mb": 100.0, "vms_mb": 300.0, "percent": 41.5}
    assert body["connections"] == {"active": 3}
    assert body["objects"] == {"rpc_objects": 7, "connection_objects": 3}
    assert body["tasks"] == {"active": 40}
    assert body["system"] == {"memory_percent": 41.5, "disk_usage": 63.0, "load_average": [0.5, 0.25, 0.125]}
    assert body["uptime_seconds"] == 12.35


def test_hyphas_thresholds_lower_the_score_and_name_the_issue_but_do_not_take_the_replica_down():
    status, body = report(replace(FACTS, rss=3 * 1024 * MB, tasks=5000))
    assert status == 200
    assert body["status"] == "HEALTHY"
    assert body["health_score"] == 65
    assert body["issues"] == ["High memory usage (>2GB)", "High active task count (5000)"]


def test_a_replica_that_does_not_serve_is_down_with_its_reason():
    status, body = report(replace(FACTS, ready=False, why="event bus: no pub/sub connection"))
    assert status == 503
    assert (body["status"], body["health_score"], body["issues"]) == ("DOWN", 0, ["event bus: no pub/sub connection"])


def test_facts_the_process_cannot_read_are_null():
    _, body = report(replace(FACTS, rss=None, vms=None, memory_percent=None, load_average=None, disk_percent=None))
    assert body["memory"] == {"rss_mb": None, "vms_mb": None, "percent": None}
    assert body["system"] == {"memory_percent": None, "disk_usage": None, "load_average": None}
