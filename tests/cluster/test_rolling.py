"""Rolling restart of three replicas under load, with SIGTERM (drain) and with SIGKILL.

The scenario lives in ``bench/roll.py`` (operators run it as a benchmark);
bench/ is not a package and must not import from tests/, so this module loads
that file by path with ``importlib.util.spec_from_file_location``: one
implementation, two uses. Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.alone, pytest.mark.timeout(180)]

ROLL_PY = Path(__file__).resolve().parents[2] / "bench" / "roll.py"
DRAIN_TIMEOUT = 10.0  # the replicas' default --drain-timeout


def _load_roll() -> ModuleType:
    spec = importlib.util.spec_from_file_location("switchboard_bench_roll", ROLL_PY)
    assert spec is not None, ROLL_PY
    assert spec.loader is not None, ROLL_PY
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


roll = _load_roll()


async def test_sigterm_roll_loses_no_idempotent_call_and_every_client_stays_reachable(redis_server):
    cfg = roll.RollConfig(
        signal="term", rate=50, clients_per_replica=1, non_idempotent_rate=2, pause=1.0, warmup=1.5, settle=2.0
    )
    result = await roll.run_roll(cfg, valkey=redis_server)
    print("\n" + roll.report("SIGTERM roll", result))

    assert result["all_callable"], f"not callable after the roll: {result['not_callable']}"
    assert not result["gave_up"], result["gave_up"]
    assert result["owners_clean"], (result["stale_owners"], result["unregistered_providers"])
    assert all(step["exit_code"] == 0 for step in result["steps"]), result["steps"]

    assert all(step["exit_s"] < DRAIN_TIMEOUT for step in result["steps"]), "a drain was held to its timeout"
    assert result["idempotent"]["failed"] == 0, result["idempotent"]["errors"]
    # The target is < 1 s per client; measured 0.15 s on 2 cores (bench/roll.py). 3 s is the
    # CI-safe bound on a shared machine.
    assert result["unreachable_max_s"] < 3.0, result["unreachable_s"]


ROLLS = 20


@pytest.mark.timeout(420)
async def test_twenty_sigterm_rolls_fail_no_call_of_an_sdk_or_a_plain_hypha_rpc_caller(redis_server):
    """Issue 15: three replicas, one provider on each, 50 calls/s from the SDK and 50 from an
    unmodified hypha-rpc client (through a balancer); every replica in turn SIGTERMed, started
    again, the next one once it is ready; twenty such rolls in a row. A provider handed to a
    sibling is in transit, not gone: nothing may fail.

    A step takes at least 2.6 s (exit, start, a pause of 1.9 s or more): the plain caller's
    connection then lives two steps, past hypha-rpc's 5 s flap window (a connection that lived
    less makes its next reconnect back off, 1 s, then 2, 4, ...: a client's own choice, not the hub's)."""
    cfg = roll.RollConfig(
        signal="term",
        rate=50,
        clients_per_replica=1,
        non_idempotent_rate=2,
        pause=1.9,
        step=2.6,
        warmup=1.0,
        settle=2.0,
        rolls=ROLLS,
        hypha_caller=True,
    )
    result = await roll.run_roll(cfg, valkey=redis_server)
    print("\n" + roll.report(f"{ROLLS} SIGTERM rolls", result))

    assert result["all_callable"], f"not callable after the rolls: {result['not_callable']}"
    assert not result["gave_up"], result["gave_up"]
    assert all(step["exit_code"] == 0 for step in result["steps"]), result["steps"]
    assert len(result["steps"]) == 3 * ROLLS
    for who in ("sdk", "hypha"):
        fig = result["by_caller"][who]
        assert fig["calls"] > 40 * result["roll_seconds"], (who, fig["calls"])  # the load really ran
    sdk, hypha = result["by_caller"]["sdk"], result["by_caller"]["hypha"]
    assert sdk["failed"] == 0, (sdk["errors"], result["failed_per_roll"])
    # a call the plain caller sends in the moment after its replica ended the stream, before it
    # has taken that end in, is still routed: the replica reads on, and the test balancer passes
    # the half-close on as a Service does (it once closed both ways, and such calls timed out)
    assert hypha["failed"] == 0, (hypha["errors"], result["failed_per_roll"])
    assert result["departures_seen"] == [], "a provider in transit was announced gone"
    assert max(result["transit_s"]) < GRACE, "a client took longer than the grace to come back"


GRACE = 5.0  # the replicas' default --transit-grace


async def test_sigkill_roll_every_client_comes_back_and_the_dead_replicas_registrations_go(redis_server):
    cfg = roll.RollConfig(
        signal="kill",
        rate=50,
        clients_per_replica=1,
        non_idempotent_rate=2,
        pause=1.0,
        warmup=1.5,
        settle=2.0,
        cleanup_timeout=40.0,
    )
    result = await roll.run_roll(cfg, valkey=redis_server)
    print("\n" + roll.report("SIGKILL roll", result))  # failed calls are reported, not asserted

    assert result["all_callable"], f"not callable after the roll: {result['not_callable']}"
    assert not result["gave_up"], result["gave_up"]
    # every sb:owner entry names a live incarnation, every provider is registered, and the
    # abandoned clients of the killed incarnations were reaped
    assert result["owners_clean"], (result["stale_owners"], result["unregistered_providers"])
    assert not result["stranded_left"], result["stranded_left"]
