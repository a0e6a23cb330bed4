"""Where Switchboard's replicas spend their CPU under workload 3 (32 callers, cross replica).

    python bench/compare.py --profile-switchboard SECONDS

Samples both replicas with py-spy (``pip install py-spy``; non-blocking, 100 Hz) while the
callers run, and prints the functions with the most samples on top of the stack (self)
and anywhere in it (inclusive). Raw collapsed stacks are left in the printed directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from _common import say
from _workloads import DEFAULT, RpcSide, concurrent, make_servers


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy not found: pip install py-spy")
    return found


IDLE_LEAVES = ("EpollSelector.select", "select (selectors.py")  # the event loop waiting: not work


def top_functions(raw: Path, n: int = 12) -> dict[str, Any]:
    """Self and inclusive shares of the busy samples (those not waiting in the event loop's
    select); each self entry also names the innermost switchboard frame above it."""
    self_c: Counter[str] = Counter()
    via: dict[str, Counter[str]] = {}
    incl: Counter[str] = Counter()
    total = busy = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        total += c
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames or frames[-1].startswith(IDLE_LEAVES):
            continue
        busy += c
        self_c[frames[-1]] += c
        ours = [f for f in frames[:-1] if "switchboard/" in f and "__main__" not in f and "cli.py" not in f]
        via.setdefault(frames[-1], Counter())[ours[-1] if ours else "-"] += c
        for f in set(frames):
            incl[f] += c
    if not busy:
        return {"samples": total, "busy": 0, "self": [], "inclusive": []}
    return {
        "samples": total,
        "busy": busy,
        "self": [(f, c / busy, via[f].most_common(1)[0][0]) for f, c in self_c.most_common(n)],
        "inclusive": [(f, c / busy) for f, c in incl.most_common(n * 4)],
    }


async def profile(seconds: float) -> None:
    from switchboard.testing import ValkeyServer

    work = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    valkey = ValkeyServer()
    await asyncio.to_thread(valkey.start)
    servers = make_servers("switchboard", valkey.url)
    side = RpcSide(servers, work)
    spies: list[asyncio.subprocess.Process] = []
    try:
        for s in servers:
            await asyncio.to_thread(s.start)
            await asyncio.to_thread(s.wait_ready)
        await side.setup()
        eps = [await side.endpoint(1, f"tp{i}") for i in range(DEFAULT.tp_connections)]
        pids = {"replica_a": servers[0].pid, "replica_b": servers[1].pid, "valkey": valkey.pid, **side.pids()}
        run = asyncio.create_task(concurrent(eps, DEFAULT.tp_callers, seconds + 1.0, 1.0, pids))
        await asyncio.sleep(1.5)
        for s in servers:
            spies.append(
                await asyncio.create_subprocess_exec(
                    py_spy(),
                    "record",
                    "--pid",
                    str(s.pid),
                    "--duration",
                    str(int(seconds)),
                    "--rate",
                    "100",
                    "--format",
                    "raw",
                    "--function",
                    "--nonblocking",
                    "--output",
                    str(work / f"{s.name}.txt"),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.STDOUT,
                )
            )
        result = await run
        for sp in spies:
            await asyncio.wait_for(sp.wait(), seconds + 30)
    finally:
        for sp in spies:
            if sp.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    sp.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(side.close(), 30)
        for s in servers:
            await asyncio.to_thread(s.kill)
        await asyncio.to_thread(valkey.stop)
    print(
        f"workload 3 under py-spy: {result['calls_per_s']:.0f} calls/s, errors {result['errors']}, "
        f"CPU util % { ({k: round(v) for k, v in result['cpu_util_pct'].items()}) }"
    )
    for s in servers:
        raw = work / f"{s.name}.txt"
        if not raw.exists():
            print(f"{s.name}: no profile written")
            continue
        top = top_functions(raw)
        print(f"\n{s.name}: {top['samples']} samples, {top['busy']} busy; self time (share of busy):")
        for f, share, caller in top["self"]:
            print(f"  {share * 100:5.1f}%  {f}    <- {caller}")
        print("  inclusive (switchboard frames):")
        for f, share in [x for x in top["inclusive"] if "switchboard/" in x[0]][:14]:
            print(f"  {share * 100:5.1f}%  {f}")
    say(f"raw stacks in {work}")
