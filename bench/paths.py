#!/usr/bin/env python
"""The hub's routing paths alone, in-process: CPU per frame, working tree against a base revision.

    python bench/paths.py [--base GIT_REF] [--rounds N]

``bench/ab.py`` measures a whole cross-replica echo (sockets, event loop,
clients); this isolates what the hub's own code costs per frame, with no
socket in the way, to tell a slower routing core from everything around it.
Each revision runs in its own interpreter (``src/`` of the base extracted by
``git archive``), on the embedded backends, with clients whose transport takes
every frame at once. Three paths (20,000 frames or pairs each):

* ``local``: a call from one client here to another, and the reply back;
* ``relayed``: a call and a reply that another replica sent here, into a client here;
* ``forward``: a call (alone) to a client on another replica, handed to a direct
  link (the link is replaced by a function that takes the frame: no socket).

The collector is tuned as ``switchboard serve`` tunes it (``server/process/collector.py``:
what was built before serving frozen, a young collection every 2,000 objects): without it,
a revision with more modules paid more per frame in full collections over its start-up heap,
which a served replica never walks.

Prints the minimum over rounds (microseconds of process CPU per pair, or per
call for ``forward``) and the
ratio new / base; the revisions alternate round by round, so that foreign load
hits both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import checkout_src  # noqa: E402

WORKER = r"""
import asyncio, json, sys, time
import msgpack
try:  # the hub in sub-packages (this revision on)
    from switchboard.hub.identity.users import new_anonymous_user
    from switchboard.hub.sessions.peer import Peer
except ImportError:  # a base revision of before
    from switchboard.hub.users import new_anonymous_user
    from switchboard.hub.peer import Peer
from switchboard.server.app import build_hub
from switchboard.server.process.collector import tune
from switchboard.testing.hub import settings_for_tests

N = 20_000
WS = "ws-1"


class Takes:
    def __init__(self):
        self.frames = 0

    def try_send(self, frame):
        self.frames += 1
        return True

    async def send_bytes(self, data):
        self.frames += 1

    async def send_text(self, text):
        pass

    async def close(self, code, reason):
        pass


def frame(head, args):
    return msgpack.packb(head) + msgpack.packb({"args": args, "with_kwargs": False})


async def run(path):
    hub = build_hub(settings_for_tests(max_messages_per_second=1e9, message_burst=10**9, max_pending_calls=10**9))
    await hub.start()
    tune()  # the collector as a served replica has it: what was built before serving frozen
    user = new_anonymous_user()
    peers = {}
    for cid in ("caller", "prov"):
        peer = Peer(workspace=WS, client_id=cid, user=user, transport=Takes(), max_queue_bytes=1 << 20,
                    replica_id=hub.replica_id)
        await hub.attach(peer, reconnecting=False)
        asyncio.create_task(peer.run_writer())
        peers[cid] = peer
    await asyncio.sleep(0.05)
    caller, prov = peers["caller"], peers["prov"]
    # before the routing core (b0f17d2) the same steps had other names
    relayed = getattr(getattr(hub, "dispatch", None), "from_replica_to_client", None) or hub._on_bus_client
    taken = []
    if path == "forward":
        unicast = getattr(hub, "unicast", None) or getattr(getattr(hub, "dispatch", None), "remote", None)
        unicast = getattr(unicast, "unicast", unicast)
        if unicast is not None:
            unicast.send = lambda channel, data, **_: taken.append(1) or True
        else:
            hub.bus.try_direct = lambda channel, data: taken.append(1) or True
    target = f"{WS}/remote" if path == "forward" else f"{WS}/prov"
    calls = [frame({"type": "method", "to": target, "method": "services.echo.echo", "session": f"s{i}"}, ["x" * 32])
             for i in range(N)]
    replies = [frame({"type": "method", "to": f"{WS}/caller", "method": f"s{i}.resolve"}, ["x" * 32]) for i in range(N)]
    stamped_calls = [frame({"type": "method", "from": f"{WS}/caller", "ws": WS, "user": {"id": "u"}, "to": f"{WS}/prov",
                            "method": "services.echo.echo", "session": f"r{i}"}, ["x" * 32]) for i in range(N)]
    stamped_replies = [frame({"type": "method", "from": f"{WS}/caller", "ws": WS, "user": {"id": "u"},
                              "to": f"{WS}/prov", "method": f"t{i}.resolve"}, ["x" * 32]) for i in range(N)]
    start = time.process_time()
    for i in range(N):
        if path == "relayed":
            relayed(prov, stamped_calls[i])
            relayed(prov, stamped_replies[i])
            continue
        rest = hub.route_binary(caller, calls[i])
        if rest is not None:
            await rest
        if path == "local":
            rest = hub.route_binary(prov, replies[i])
            if rest is not None:
                await rest
    spent = time.process_time() - start
    delivered = caller.transport.frames + prov.transport.frames + len(taken)
    await hub.stop()
    return spent / N * 1e6, delivered


print(json.dumps(asyncio.run(run(sys.argv[1]))))
"""

PATHS = ("local", "relayed", "forward")


def one(src: str, path: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", WORKER, path],
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"{path} on {src} failed:\n{out.stderr[-2000:]}")
    spent, delivered = json.loads(out.stdout.strip().splitlines()[-1])
    if delivered < 20_000:
        raise SystemExit(f"{path} on {src}: only {delivered} frames delivered (refused by a limit?)")
    return float(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", metavar="GIT_REF", help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=5, help="interpreters per path and revision (default 5)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    sides = {"new": str(Path(__file__).resolve().parent.parent / "src"), "base": checkout_src(args.base)}
    for path in PATHS:
        got: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(args.rounds):
            for name in sides if i % 2 == 0 else list(sides)[::-1]:
                got[name].append(one(sides[name], path))
        new, base = min(got["new"]), min(got["base"])
        print(
            f"{path:>8}: new {new:6.2f} us, base {base:6.2f} us; new/base x{new / base:.3f}"
            f" (medians {statistics.median(got['new']):.2f} / {statistics.median(got['base']):.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
