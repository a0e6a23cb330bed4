#!/usr/bin/env python
"""The fuzzing properties of tests/security/test_fuzz.py, with many more examples.

    python bench/fuzz.py                      # 20,000 examples per property
    FUZZ_EXAMPLES=2000 python bench/fuzz.py   # fewer
    FUZZ_ONLY=decode,http python bench/fuzz.py

    FUZZ_ONLY=outsider-provider,outsider-manager,outsider-http FUZZ_TRUST_HUBS=single,cluster python bench/fuzz.py

Properties: ``decode`` (envelope.decode → route → stamp), ``hello``
(handshake.parse_hello), ``control`` (handshake.parse_control), ``query``
(services.parse_query), ``registration`` (services.prepare_registration),
``http`` (the HTTP call endpoint of a live in-process hub) and ``websocket``
(raw frames against that hub), from tests/security/test_fuzz.py; and the
outsider of tests/security/test_trust_boundary.py: ``outsider-provider`` and
``outsider-manager`` (frames smuggling identity fields, ``ctx``, promise
targets and odd ``to`` ids, to W's provider and to the manager) and
``outsider-http`` (junk paths and bearer tokens at W's services), each example
followed by that module's invariant (nothing of W ran or returned, no token for
W, W's services unchanged). They run against the hubs ``FUZZ_TRUST_HUBS`` names
(``single``, an in-process hub, by default; ``cluster``: two replica processes
on one Valkey).

The strategies and checks are imported from the test modules, so CI and this
run fuzz exactly the same things. For each property it prints the examples
run, how they ended (e.g. ``refused``, ``routed``, HTTP statuses), the time
taken and PASS or the falsifying example; it exits 1 if any property failed,
and a live hub must end serving and with no leaked peers.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, filename: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "security" / filename)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


fuzz = _load("security_fuzz", "test_fuzz.py")
trust = _load("security_trust_boundary", "test_trust_boundary.py")

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20000"))
ONLY = {name for name in os.environ.get("FUZZ_ONLY", "").split(",") if name}
OUTSIDER = {"outsider-provider", "outsider-manager", "outsider-http"}
TRUST_HUBS = [kind for kind in os.environ.get("FUZZ_TRUST_HUBS", "single").split(",") if kind]


def run(name: str, strategy: Any, check: Callable[[Any], Any], label: str | None = None) -> bool:
    if ONLY and name not in ONLY:
        return True
    outcomes: collections.Counter[str] = collections.Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.generate, Phase.shrink),
    )
    @given(strategy)
    def prop(value: Any) -> None:
        outcomes[str(check(value) or "ok")] += 1

    started = time.monotonic()
    try:
        prop()
        verdict = "PASS"
    except Exception as exc:  # the falsifying example is in the exception's notes
        verdict = "FAIL\n" + "".join(traceback.format_exception(exc))[-4000:]
    elapsed = time.monotonic() - started
    total = sum(outcomes.values())
    tally = ", ".join(f"{k} {v}" for k, v in outcomes.most_common())
    print(
        f"{label or name:<26} {total:>7} examples in {elapsed:7.1f}s ({total / elapsed:7.0f}/s)  {verdict.splitlines()[0]}  [{tally}]",
        flush=True,
    )
    if verdict != "PASS":
        print(verdict, flush=True)
    return verdict == "PASS"


def main() -> int:
    print(f"fuzzing with {EXAMPLES} examples per property", flush=True)
    ok = all(
        [
            run("decode", fuzz.frames, fuzz.check_frame),
            run("hello", fuzz.hellos, fuzz.check_hello),
            run("control", fuzz.control_texts, fuzz.check_control),
            run("query", fuzz.ids | fuzz.values, fuzz.check_query),
            run("registration", fuzz.registrations, fuzz.check_registration),
        ]
    )
    if not ONLY or ONLY & {"http", "websocket"}:
        try:
            with fuzz.live_hub() as hub:

                def http(case: dict[str, Any]) -> str:
                    return f"HTTP {hub.run(fuzz.http_case(hub, case))}"

                def websocket(case: dict[str, Any]) -> str:
                    outcome = hub.run(fuzz.ws_case(hub, case, "raw"))
                    hub.run(
                        fuzz.eventually(
                            lambda: not [p for p in hub.server.hub.peers if p.endswith("/raw")],
                            timeout=5,
                            what="the raw client to be detached",
                        )
                    )
                    return outcome

                ok = run("http", fuzz.requests, http) and ok
                ok = run("websocket", fuzz.ws_cases, websocket) and ok
            print("live hub afterwards: serving, no leaked peers, nothing logged at ERROR", flush=True)
        except AssertionError as exc:
            print(f"live hub afterwards: FAIL {exc}", flush=True)
            ok = False
    if not ONLY or ONLY & OUTSIDER:
        ok = outsider() and ok
    print("all properties held" if ok else "SOME PROPERTY FAILED", flush=True)
    return 0 if ok else 1


def outsider() -> bool:
    """The outsider properties against each hub of FUZZ_TRUST_HUBS.

    The clients live on this event loop; hypothesis runs in a worker thread and
    hands each example's check to the loop, as the test module does.
    """

    async def each_hub() -> bool:
        loop = asyncio.get_running_loop()
        ok = True
        for kind in TRUST_HUBS:
            async with trust.open_scenario(kind) as sc:
                for name, strategy, check in trust.outsider_properties(sc):

                    def bridged(case: Any, check: Any = check) -> str:
                        return asyncio.run_coroutine_threadsafe(check(case), loop).result(120)

                    held = await asyncio.to_thread(run, name, strategy, bridged, f"{name}@{kind}")
                    ok = held and ok
                await sc.assert_bystander_served()
            print(f"{kind} hub afterwards: the bystander is still served", flush=True)
        return ok

    try:
        return asyncio.run(each_hub())
    except AssertionError as exc:
        print(f"outsider: FAIL {exc}", flush=True)
        return False


if __name__ == "__main__":
    sys.exit(main())
