"""A CPU-time sampler and a garbage-collection timer for any Python process of a bench.

py-spy samples wall-clock time: a replica preempted right after a write that
woke another process (Valkey, a client) is counted in that write for as long
as it waits for a core, so on a loaded machine py-spy puts 15 to 30 % of a
replica in its socket writes where ``perf`` counts 13 % of it in the kernel
all told. This samples CPU time instead: SIGPROF every ``SB_PROBE_PERIOD``
seconds of the process's CPU (4 ms), each sample the Python stack of the main
thread (time in C, a system call included, goes to the Python line that made
the call). It also times every collection of the garbage collector
(``gc.callbacks``), by generation, in CPU and wall time.

Use: ``PYTHONPATH=bench/cpu_probe SB_PROBE_DIR=/tmp/probe .venv/bin/python bench/...``
(a child started with its own ``PYTHONPATH``, as ``--against`` does, is not
sampled). Every process started so writes, each second, ``stacks-<pid>.txt``
(collapsed stacks with their sample counts, since the start) and appends a
line to ``gc-<pid>.log`` (time, process CPU, then per generation
``g<n>:<collections>:<wall s>:<cpu s>``); with ``SB_PROBE_SNAP=1`` a replica
(``serve`` in its arguments) also keeps a copy of its stacks each second,
``snap-<pid>-<time>.txt``, so that two moments can be subtracted.
"""

from __future__ import annotations

import atexit
import collections
import gc
import os
import shutil
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any


def _install(out: str, period: float) -> None:
    pid = os.getpid()
    stacks: collections.Counter[str] = collections.Counter()
    spent: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter[int] = collections.Counter()
    started = {"wall": 0.0, "cpu": 0.0}

    def sample(signum: int, frame: FrameType | None) -> None:
        parts = []
        while frame is not None and len(parts) < 60:
            code = frame.f_code
            where = code.co_filename.split("site-packages/")[-1].split("/src/")[-1]
            parts.append(f"{code.co_name} ({where}:{frame.f_lineno})")
            frame = frame.f_back
        stacks[";".join(reversed(parts))] += 1

    def collected(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started["wall"], started["cpu"] = time.perf_counter(), time.thread_time()
            return
        generation = info["generation"]
        spent[f"wall{generation}"] += time.perf_counter() - started["wall"]
        spent[f"cpu{generation}"] += time.thread_time() - started["cpu"]
        counts[generation] += 1

    def write() -> None:
        while True:
            time.sleep(1.0)
            path = f"{out}/stacks-{pid}.txt"
            with open(path + ".tmp", "w") as fh:
                fh.writelines(f"{stack} {n}\n" for stack, n in list(stacks.items()))
            os.replace(path + ".tmp", path)
            if os.environ.get("SB_PROBE_SNAP") and "serve" in sys.argv:
                shutil.copy(path, f"{out}/snap-{pid}-{int(time.time())}.txt")
            cpu = sum(os.times()[:2])
            gens = " ".join(f"g{g}:{counts[g]}:{spent[f'wall{g}']:.4f}:{spent[f'cpu{g}']:.4f}" for g in (0, 1, 2))
            with open(f"{out}/gc-{pid}.log", "a") as fh:
                fh.write(f"{time.time():.3f} cpu {cpu:.3f} {gens}\n")

    signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, period, period)
    atexit.register(signal.setitimer, signal.ITIMER_PROF, 0)  # SIGPROF's default action ends a process
    gc.callbacks.append(collected)
    threading.Thread(target=write, daemon=True, name="cpu-probe").start()


if os.environ.get("SB_PROBE_DIR"):
    _install(os.environ["SB_PROBE_DIR"], float(os.environ.get("SB_PROBE_PERIOD", "0.004")))
