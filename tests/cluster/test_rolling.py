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

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

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
    cfg = roll.RollConfig(signal="term", rate=50, clients_per_replica=1, non_idempotent_rate=2,
                          pause=1.0, warmup=1.5, settle=2.0)
    result = await roll.run_roll(cfg, valkey=redis_server)
    print("\n" + roll.report("SIGTERM roll", result))

    assert result["all_callable"], f"not callable after the roll: {result['not_callable']}"
    assert not result["gave_up"], result["gave_up"]
    assert result["owners_clean"], (result["stale_owners"], result["unregistered_providers"])
    assert all(step["exit_code"] == 0 for step in result["steps"]), result["steps"]

    held = [s["replica"] for s in result["steps"] if s["exit_s"] >= DRAIN_TIMEOUT]
    if held and (result["idempotent"]["failed"] or result["unreachable_max_s"] >= 3.0):
        # Known server defect (src/switchboard/hub/hub.py, owned elsewhere): a drain is held for the
        # whole drain timeout by calls that can never finish (a cross-replica manager call to a
        # provider, e.g. get_service's, is never closed in InFlight; the caller's replies are lost
        # once its channel is unsubscribed), while calls to its clients expire in the senders'
        # 6 s retry windows ("Target peer ... is not connected"). Measured with it: 50-230 failed
        # idempotent calls, ~10 s unreachability; with the fix patched in: 0 and ~0.2-0.3 s.
        pytest.xfail(f"drain held {DRAIN_TIMEOUT:g} s on {held}: {result['idempotent']['failed']} failed "
                     f"idempotent calls, {result['unreachable_max_s']:.1f} s unreachable (known hub defect)")
    assert result["idempotent"]["failed"] == 0, result["idempotent"]["errors"]
    # Target < 1 s per client; measured 0.2-0.3 s on 2 cores once drains finish promptly. 3 s is the CI bound.
    assert result["unreachable_max_s"] < 3.0, result["unreachable_s"]


async def test_sigkill_roll_every_client_comes_back_and_the_dead_replicas_registrations_go(redis_server):
    cfg = roll.RollConfig(signal="kill", rate=50, clients_per_replica=1, non_idempotent_rate=2,
                          pause=1.0, warmup=1.5, settle=2.0, cleanup_timeout=40.0)
    result = await roll.run_roll(cfg, valkey=redis_server)
    print("\n" + roll.report("SIGKILL roll", result))  # failed calls are reported, not asserted

    assert result["all_callable"], f"not callable after the roll: {result['not_callable']}"
    assert not result["gave_up"], result["gave_up"]
    # every sb:owner entry names a live incarnation, every provider is registered, and the
    # abandoned clients of the killed incarnations were reaped
    assert result["owners_clean"], (result["stale_owners"], result["unregistered_providers"])
    assert not result["stranded_left"], result["stranded_left"]
    assert result["reaped_clients"] >= 3
