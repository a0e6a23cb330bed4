"""What holds a replica's event loop: loaded into ``switchboard serve`` by ``bench/storm.py --holds``.

Python imports ``sitecustomize`` from the path at start-up; ``storm.py --holds`` puts this
directory on the replicas' ``PYTHONPATH`` and names a file in ``STORM_HOLDS_OUT`` (one per
replica, by its id). Once the server serves, a task sleeps :data:`STEP` again and again; each time
it wakes more than :data:`HOLD` late, it writes a line: when, how late, and, from the kernel's
accounting of the loop's thread (``/proc/self/task/<tid>/schedstat``), how much of it the thread
ran and how much it waited for a core, and the garbage collections that ended meanwhile
(generation, CPU, objects freed). A hold the loop ran is the replica's own work; one it waited is
the machine's. Bench use only: nothing of the project imports it.
"""

import gc
import json
import os
import sys
import threading
import time

STEP = 0.005  # seconds the probe sleeps
HOLD = 0.02  # seconds late that count as a hold


def _install(out: str) -> None:
    collections: list[
        tuple[float, int, float, int]
    ] = []  # since the probe last woke: (ended, generation, cpu s, freed)
    started = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            collections.append(
                (time.monotonic(), info["generation"], time.thread_time() - started[0], info["collected"])
            )

    gc.callbacks.append(timed)
    # opened here, in the main thread, which runs the event loop; both live as long as the process
    sched = open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb", buffering=0)  # noqa: SIM115
    f = open(out, "a")  # noqa: SIM115

    def ran_waited() -> tuple[int, int]:
        sched.seek(0)
        ran, waited, _ = sched.read().split()
        return int(ran), int(waited)

    async def probe() -> None:
        import asyncio

        while True:
            t = time.monotonic()
            r0, w0 = ran_waited()
            await asyncio.sleep(STEP)
            now = time.monotonic()
            r1, w1 = ran_waited()
            late = now - t - STEP
            during, collections[:] = collections[:], []
            if late > HOLD or any(c[2] > 0.002 for c in during):
                line = {
                    "t": now,
                    "late_ms": late * 1e3,
                    "ran_ms": (r1 - r0) / 1e6,
                    "waited_ms": (w1 - w0) / 1e6,
                    "gc": [[g, cpu * 1e3, freed] for _, g, cpu, freed in during],
                }
                f.write(json.dumps(line) + "\n")
                f.flush()

    import uvicorn.server

    serve = uvicorn.server.Server.serve

    async def serve_probed(self, sockets=None):  # type: ignore[no-untyped-def]
        import asyncio

        asyncio.ensure_future(probe())
        return await serve(self, sockets)

    uvicorn.server.Server.serve = serve_probed


if os.environ.get("STORM_HOLDS_OUT") and "serve" in sys.argv and "--replica-id" in sys.argv:
    _install(os.environ["STORM_HOLDS_OUT"] + "." + sys.argv[sys.argv.index("--replica-id") + 1])
