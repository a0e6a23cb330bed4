#!/usr/bin/env python
"""Switchboard against Hypha (PyPI hypha==0.21.137), and both against the physical floor.

    python bench/compare.py [--quick] [--only switchboard|hypha] [--rounds N] [--update-docs]

Each round starts a fresh Valkey and two replicas of one server sharing it, all on
127.0.0.1, runs every workload against them and stops them; rounds alternate
Switchboard, Hypha, floor, Switchboard, Hypha, floor, ... and each figure is the median
over the rounds of its kind. Both hubs are driven by the same unmodified hypha-rpc
0.21.47 client code (bench/_workers.py, bench/_workloads.py: only the URL differs);
the floor is a raw WebSocket relay with the same processes, hops and message sizes
(bench/_floor.py). Hypha is installed into bench/.hypha-venv on first use
(bench/_hypha.py says how it is run and why).

Workloads: 1. echo 32 B sequential, same replica (caller and provider on A) and cross
replica (caller on B): p50/p90/p99; 2. the same with 64 KiB and 4 MiB (MB/s = payload
bytes / p50 call time); 3. 32 concurrent callers on B for a fixed time: calls/s and
the hub's CPU per call; 4. callback round trip (the service calls a function the
caller passed); 5. 10 -> 1,000 -> 5,000 idle raw-WebSocket clients per replica (hypha
handshake, then silent): RSS per connection and echo latency at each level;
6. the floor; 7. SIGKILL of replica A -> a provider that reconnects through a
failover proxy is callable again from B; SIGTERM of B -> exit.

Writes bench/results/compare.json, compare.md and compare.png.

What moved these figures, each found with a profile (``--profile-switchboard``, py-spy): permessage-deflate
off (80 % of a replica's CPU on 64 KiB payloads went to compressing); uvloop, httptools and hiredis; direct
links between replicas (one Redis PUBLISH per frame had taken 31-45 % of a replica's CPU; cross-replica echo
p50 0.98 -> 0.65 ms); frames routed in the callback that parsed them (0.65 -> 0.555 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _hypha  # noqa: E402
from _common import BENCH, calibrate, median_or_none, raise_fd_limit, ratio, say  # noqa: E402
from _workloads import DEFAULT, KIND_LABEL, QUICK, Params, run_round  # noqa: E402

RESULTS = BENCH / "results"
PERFORMANCE = BENCH.parent / "docs" / "explanation" / "performance.md"  # the docs page the table goes to


# --------------------------------------------------------------------------- figures


def _get(*path: Any) -> Callable[[dict[str, Any]], float | None]:
    def getter(r: dict[str, Any]) -> float | None:
        cur: Any = r
        for k in path:
            if not isinstance(cur, dict) or k not in cur:
                return None
            cur = cur[k]
        return cur if isinstance(cur, (int, float)) else None

    return getter


def _kib(getter: Callable[[dict[str, Any]], float | None]) -> Callable[[dict[str, Any]], float | None]:
    return lambda r: None if getter(r) is None else getter(r) / 1024  # type: ignore[operator]


def _server_cpu(r: dict[str, Any]) -> float | None:
    cpu = r.get("concurrent_cross", {}).get("cpu_us_per_call", {})
    parts = [cpu.get(k) for k in ("replica_a", "replica_b", "valkey")]
    return None if any(v is None for v in parts) else sum(parts)  # type: ignore[arg-type]


def _rss_top(r: dict[str, Any]) -> float | None:
    levels = r.get("idle", {}).get("levels") or []
    if not levels:
        return None
    rss = levels[-1]["rss_bytes"]
    vals = [rss.get(k) for k in ("replica_a", "replica_b") if rss.get(k)]
    return sum(vals) / len(vals) / 2**20 if vals else None


def _open_rate(r: dict[str, Any]) -> float | None:
    levels = r.get("idle", {}).get("levels") or []
    if len(levels) < 2:
        return None
    hi, lo = levels[-1]["opened"], levels[-2]["opened"]
    n = sum(hi["open"].values()) - sum(lo["open"].values())
    return n / hi["seconds"] if hi["seconds"] else None


def _ready(r: dict[str, Any]) -> float | None:
    vals = [v for v in r.get("start_to_ready_s") or [] if v is not None]
    return statistics.median(vals) if vals else None


def metric_rows(p: Params) -> list[tuple[str, str, str, Callable[[dict[str, Any]], float | None], bool]]:
    """(key, label, unit, getter, higher_is_better)"""
    rows: list[tuple[str, str, str, Callable[[dict[str, Any]], float | None], bool]] = []
    for where, label in (("same", "same replica"), ("cross", "cross replica")):
        for q in ("p50", "p90", "p99"):
            rows.append(
                (
                    f"echo32_{where}_{q}",
                    f"1. echo 32 B, {label}, {q}",
                    "ms",
                    _get("echo_small", where, f"{q}_ms"),
                    False,
                )
            )
    rows.append(
        (
            "echo32_cpu",
            "1. server CPU per call (2 replicas + Valkey, same & cross)",
            "ms",
            _get("echo_small", "server_cpu_ms_per_call"),
            False,
        )
    )
    for size, _ in p.sizes:
        name = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        for where, label in (("same", "same"), ("cross", "cross")):
            rows.append(
                (
                    f"echo{size}_{where}_p50",
                    f"2. echo {name}, {label}, p50",
                    "ms",
                    _get("echo_sizes", str(size), where, "p50_ms"),
                    False,
                )
            )
            rows.append(
                (
                    f"echo{size}_{where}_mbps",
                    f"2. echo {name}, {label}, throughput",
                    "MB/s",
                    _get("echo_sizes", str(size), where, "MBps_p50"),
                    True,
                )
            )
        rows.append(
            (
                f"echo{size}_cpu",
                f"2. echo {name}, server CPU per call",
                "ms",
                _get("echo_sizes", str(size), "server_cpu_ms_per_call"),
                False,
            )
        )
        rows.append(
            (
                f"echo{size}_client_cpu",
                f"2. echo {name}, client CPU per call (caller + provider)",
                "ms",
                _get("echo_sizes", str(size), "client_cpu_ms_per_call"),
                False,
            )
        )
    rows.append(
        (
            "tp_calls",
            f"3. {p.tp_callers} callers, cross replica",
            "calls/s",
            _get("concurrent_cross", "calls_per_s"),
            True,
        )
    )
    rows.append(
        (
            "tp_p99",
            f"3. {p.tp_callers} callers, cross, latency p99",
            "ms",
            _get("concurrent_cross", "latency_under_load", "p99_ms"),
            False,
        )
    )
    rows.append(("tp_cpu", "3. server CPU per call (2 replicas + Valkey)", "µs", _server_cpu, False))
    for where in ("same", "cross"):
        for q in ("p50", "p99"):
            rows.append(
                (
                    f"cb_{where}_{q}",
                    f"4. callback round trip, {where}, {q}",
                    "ms",
                    _get("callback", where, f"{q}_ms"),
                    False,
                )
            )
    rows.append(
        (
            "idle_rss_conn",
            "5. RSS per idle connection (per replica)",
            "KiB",
            _kib(_get("idle", "rss_per_connection_bytes", "replica_mean")),
            False,
        )
    )
    rows.append(
        ("idle_open_rate", f"5. idle handshakes per second (to {p.idle_levels[-1]}/replica)", "1/s", _open_rate, True)
    )
    rows.append(("idle_rss_top", f"5. RSS per replica with {p.idle_levels[-1]} idle", "MiB", _rss_top, False))
    for i, level in enumerate(p.idle_levels):
        for q in ("p50", "p99"):
            rows.append(
                (
                    f"idle{level}_cross_{q}",
                    f"5. echo cross, {level} idle/replica, {q}",
                    "ms",
                    lambda r, i=i, q=q: _get("latency", "cross", f"{q}_ms")(
                        (r.get("idle", {}).get("levels") or [{}] * (i + 1))[i]
                    ),
                    False,
                )
            )
    rows.append(
        (
            "idle_drop_busy",
            f"5. busy after {p.idle_levels[-1]}/replica idle clients drop",
            "s",
            _get("idle", "quiet_after_close_s"),
            False,
        )
    )
    rows.append(("sigterm", "7. SIGTERM -> process exit", "s", _get("recovery", "sigterm_to_exit_s"), False))
    rows.append(
        (
            "sigkill",
            "7. SIGKILL replica -> provider callable via sibling",
            "s",
            _get("recovery", "sigkill_to_callable_s"),
            False,
        )
    )
    rows.append(("ready", "start -> ready (one replica)", "s", _ready, False))
    return rows


def summarize(rounds: list[dict[str, Any]], p: Params, kinds: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, label, unit, get, higher in metric_rows(p):
        row: dict[str, Any] = {"label": label, "unit": unit, "higher_is_better": higher}
        for kind in kinds:
            vals = [get(r) for r in rounds if r["kind"] == kind]
            row[kind] = median_or_none(vals)
            row[f"{kind}_rounds"] = vals
        row["switchboard_over_hypha"] = ratio(row.get("switchboard"), row.get("hypha"))
        row["switchboard_over_floor"] = ratio(row.get("switchboard"), row.get("floor"))
        row["hypha_over_floor"] = ratio(row.get("hypha"), row.get("floor"))
        out[key] = row
    return out


def problems(rounds: list[dict[str, Any]]) -> list[str]:
    """Every error a client saw, every failed round or recovery, per round."""
    found = []
    for i, r in enumerate(rounds):
        tag = f"round {i + 1} {KIND_LABEL[r['kind']]}"
        if r.get("failed"):
            found.append(f"{tag}: round failed: {r['failed'][:300]}")

        def walk(node: Any, path: str, tag: str = tag) -> None:
            if isinstance(node, dict):
                errs = node.get("errors")
                if isinstance(errs, dict) and errs and "attempts" not in node:
                    found.append(f"{tag} {path}: {json.dumps(errs)[:300]}")
                for k, v in node.items():
                    if k not in ("errors", "log_tails"):
                        walk(v, f"{path}.{k}" if path else k)

        walk(r, "")
        for server, errs in (r.get("log_errors") or {}).items():
            if errs["lines"] and r["kind"] != "floor":
                kinds = "; ".join(f"{n}x {k}" for k, n in errs["top"][:4])
                found.append(f"{tag} server log {server}: {errs['lines']} error lines: {kinds}")
        rec = r.get("recovery") or {}
        for k in ("sigkill_existing_proxy", "sigkill_fresh_lookup"):
            if rec.get(k) and not rec[k]["ok"]:
                found.append(
                    f"{tag} recovery.{k}: not callable within the bound; "
                    f"attempt errors {json.dumps(rec[k]['errors'])[:300]}"
                )
        if rec.get("sigterm") and not rec["sigterm"]["ok"]:
            found.append(f"{tag} recovery.sigterm: {rec['sigterm'].get('detail')}")
        elif (rec.get("sigterm") or {}).get("seconds", 0) > 5:
            found.append(f"{tag} recovery.sigterm: exit took {rec['sigterm']['seconds']:.1f}s")
    return found


# --------------------------------------------------------------------------- output


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if unit in ("calls/s", "MB/s", "1/s") or abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3f}" if abs(v) < 1 else f"{v:.2f}"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_start": os.getloadavg(),
    }


def markdown(res: dict[str, Any]) -> str:
    meta = res["meta"]
    m = meta["machine"]
    kinds = meta["kinds"]
    lines = [
        f"Run {meta['date']} on {m['cpus']} cores ({m['cpu_model'] or m['processor']}), "
        f"`{meta['command']}`, Switchboard at {meta.get('versions', {}).get('switchboard_git', '?')}, "
        f"{meta['rounds']} round(s) per server, median of rounds; "
        f"load average at start {m['load_avg_start'][0]:.2f}, machine speed drift over the run "
        f"x{_x(meta.get('calibration_drift'))}.",
        "",
        "| workload | unit | Switchboard | Hypha | floor | Switchboard / Hypha | Switchboard / floor | Hypha / floor |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in res["summary"].values():
        lines.append(
            f"| {row['label']} | {row['unit']} | {_fmt(row.get('switchboard'), row['unit'])} | "
            f"{_fmt(row.get('hypha'), row['unit'])} | {_fmt(row.get('floor'), row['unit'])} | "
            f"{_x(row['switchboard_over_hypha'])} | {_x(row['switchboard_over_floor'])} | "
            f"{_x(row['hypha_over_floor'])} |"
        )
    lines += [
        "",
        "Ratios are plain quotients of the two medians: below 1 is better for ms, s, µs, KiB and MiB, "
        "above 1 is better for MB/s and calls/s. *same*: caller and provider on replica A; *cross*: "
        "caller on B, provider on A: Hypha and the floor relay through Valkey pub/sub, Switchboard "
        "sends a client's frames over a direct link between the replicas once the first one (through "
        "Valkey) has taught it the route. The floor is a raw WebSocket relay "
        "(websockets + redis-py, no RPC decoding) with the same processes, hops and payload sizes; "
        "it does not exist for workload 7. The client CPU rows are the hypha-rpc library's share "
        "(caller and provider processes), the same code for both hubs: where it dominates, "
        "the hubs cannot differ much. "
        f"Hypha: {meta['hypha_mode']}.",
    ]
    if "hypha" not in kinds:
        lines.append("Hypha was not run (`--only`).")
    if res["problems"]:
        lines += ["", "Problems seen during the run:", ""]
        lines += [f"- {p}" for p in res["problems"][:30]]
    return "\n".join(lines) + "\n"


def chart(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = res["summary"]
    kinds = [k for k in ("switchboard", "hypha", "floor") if k in res["meta"]["kinds"]]
    colors = {"switchboard": "#2b6cb0", "hypha": "#dd6b20", "floor": "#718096"}
    p_sizes = res["meta"]["params"]["sizes"]
    top = res["meta"]["params"]["idle_levels"][-1]
    big = [sz for sz, _ in p_sizes]
    panels = [
        (
            "p50 latency (ms, log)",
            True,
            [
                ("echo32_same_p50", "32 B\nsame"),
                ("echo32_cross_p50", "32 B\ncross"),
                (f"echo{big[0]}_cross_p50", f"{big[0] >> 10} KiB\ncross"),
                ("cb_cross_p50", "callback\ncross"),
                (f"idle{top}_cross_p50", f"{top} idle\ncross"),
            ],
        ),
        (
            "payload throughput (MB/s, log)",
            True,
            [
                (f"echo{sz}_{w}_mbps", f"{sz >> 20} MiB\n{w}" if sz >= 1 << 20 else f"{sz >> 10} KiB\n{w}")
                for sz in big
                for w in ("same", "cross")
            ],
        ),
        (f"{res['meta']['params']['tp_callers']} callers, cross (calls/s)", False, [("tp_calls", "calls/s")]),
        ("memory", False, [("idle_rss_conn", "KiB per idle\nconnection")]),
        ("recovery (s)", False, [("sigterm", "SIGTERM\n-> exit"), ("sigkill", "SIGKILL ->\ncallable via B")]),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, (title, log, items) in zip(axes.flat, panels, strict=False):
        width = 0.8 / len(kinds)
        for j, kind in enumerate(kinds):
            vals = [s[key].get(kind) or 0 for key, _ in items]
            xs = [i + (j - (len(kinds) - 1) / 2) * width for i in range(len(items))]
            ax.bar(xs, vals, width, label=KIND_LABEL[kind], color=colors[kind])
        ax.set_xticks(range(len(items)), [lab for _, lab in items], fontsize=8)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    ax = axes.flat[5]
    if "hypha" in kinds:
        keys = [
            ("echo32_same_p50", "32 B same p50"),
            ("echo32_cross_p50", "32 B cross p50"),
            ("echo32_cross_p99", "32 B cross p99"),
            (f"echo{big[-1]}_cross_p50", f"{big[-1] >> 20} MiB cross p50"),
            ("tp_cpu", "CPU per call"),
            ("cb_cross_p50", "callback cross p50"),
            ("idle_rss_conn", "RSS / idle conn"),
            (f"idle{top}_cross_p50", f"{top} idle cross p50"),
            ("sigterm", "SIGTERM -> exit"),
            ("sigkill", "SIGKILL recovery"),
        ]
        # For calls/s the ratio is inverted so that, on this panel, below 1 always favours Switchboard.
        vals = [s[k]["switchboard_over_hypha"] for k, _ in keys]
        labels = [lab for _, lab in keys]
        tp = s["tp_calls"]["switchboard_over_hypha"]
        vals.append(1 / tp if tp else None)
        labels.append("Hypha/SB calls/s")
        ys = range(len(vals))
        ax.barh(list(ys), [v or 0 for v in vals], color=["#2f855a" if (v or 0) < 1 else "#c53030" for v in vals])
        for y, v in zip(ys, vals, strict=True):
            ax.text((v or 0) + 0.02, y, "n/a" if v is None else f"{v:.2f}", va="center", fontsize=7)
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xlim(0, max([2.0] + [v * 1.15 for v in vals if v]))
        ax.set_title("Switchboard / Hypha (< 1: Switchboard better)", fontsize=10)
        ax.invert_yaxis()
    else:
        ax.axis("off")
    m = res["meta"]["machine"]
    fig.suptitle(
        f"Switchboard vs Hypha {_hypha.HYPHA_VERSION} (2 replicas + Valkey each, hypha-rpc 0.21.47 clients) - "
        f"{res['meta']['date']}, {m['cpus']} cores {m['cpu_model'] or m['processor']}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def update_docs(md: str) -> None:
    """Put the table between the markers of docs/explanation/performance.md; nothing else there changes."""
    text = PERFORMANCE.read_text()
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    table, _, rest = md.partition("\nProblems seen during the run:")
    if rest:
        table += "\nThe run logged problems; they are listed in `bench/results/compare.md`.\n"
    block = f"{start}\n{table}\nThe chart of this run: `bench/results/compare.png`.\n{end}"
    if start not in text or end not in text:
        raise SystemExit(f"{PERFORMANCE} lost its markers {start} ... {end}")
    text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    PERFORMANCE.write_text(text)


# --------------------------------------------------------------------------- main


async def run(p: Params, kinds: list[str], command: str, mode: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    t_start = time.perf_counter()
    res: dict[str, Any] = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "command": command,
            "mode": mode,
            "kinds": kinds,
            "rounds": p.rounds,
            "params": {k: v for k, v in p.__dict__.items() if k != "notes"},
            "machine": machine(),
            "fd_limit": raise_fd_limit(),
            "calibration_ms_start": calibrate(),
            "work_dir": str(work),
        }
    }
    rounds: list[dict[str, Any]] = []
    for i in range(p.rounds):
        for kind in kinds:
            say(f"round {i + 1}/{p.rounds}: {KIND_LABEL[kind]} (2 replicas + Valkey)")
            r = await run_round(kind, p, work / f"r{i + 1}-{kind}")
            say(f"   done in {r['round_seconds']:.0f}s")
            rounds.append(r)
    res["meta"]["calibration_ms_end"] = calibrate()
    res["meta"]["calibration_drift"] = ratio(res["meta"]["calibration_ms_end"], res["meta"]["calibration_ms_start"])
    res["meta"]["load_avg_end"] = os.getloadavg()
    res["meta"]["total_seconds"] = time.perf_counter() - t_start
    res["summary"] = summarize(rounds, p, kinds)
    res["problems"] = problems(rounds)
    res["rounds"] = rounds
    shutil.rmtree(work, ignore_errors=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round, smaller counts (about 1 min)")
    ap.add_argument("--only", choices=["switchboard", "hypha"], help="run one hub (and the floor)")
    ap.add_argument("--rounds", type=int, help="rounds per server (default 3, --quick 1)")
    ap.add_argument("--update-docs", action="store_true", help="put the table into docs/explanation/performance.md")
    ap.add_argument(
        "--switchboard-ref",
        metavar="GIT_REF",
        help="run the replicas from this revision's src/ (default: the working tree)",
    )
    ap.add_argument(
        "--profile-switchboard",
        type=float,
        metavar="SECONDS",
        help="instead: py-spy both Switchboard replicas under workload 3 and print hot spots",
    )
    args = ap.parse_args()
    if args.switchboard_ref:
        os.environ["BENCH_SWITCHBOARD_SRC"] = checkout_src(args.switchboard_ref)
    if args.profile_switchboard:
        from _profile import profile

        raise_fd_limit()
        asyncio.run(profile(args.profile_switchboard))
        return
    p = QUICK if args.quick else DEFAULT
    if args.rounds:
        p = Params(**{**p.__dict__, "rounds": max(1, args.rounds)})
    kinds = [args.only, "floor"] if args.only else ["switchboard", "hypha", "floor"]
    command = "python bench/compare.py" + "".join(f" {a}" for a in sys.argv[1:])

    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import hypha_rpc  # noqa: F401  (it sets its loggers' levels on import: import it first)

    for name in ("RPC", "websocket-client", "hypha-rpc"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # reconnect noise while replicas are killed

    hypha_info: dict[str, Any] = {}
    if "hypha" in kinds:
        hypha_info = _hypha.ensure_venv(say)
        hypha_info.update(_hypha.versions())
    res = asyncio.run(run(p, kinds, command, "quick" if args.quick else "default"))
    res["meta"]["hypha"] = hypha_info
    res["meta"]["hypha_mode"] = (
        f"{_hypha.HYPHA_VERSION}, 2 replicas sharing one Valkey (`python -m hypha.server --redis-uri ... "
        "--server-id hypha-a|hypha-b`, same `JWT_SECRET`, connection limits raised), see bench/_hypha.py"
    )
    res["meta"]["versions"] = _versions()
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS / "compare.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.replace(RESULTS / "compare.json")
    md = markdown(res)
    (RESULTS / "compare.md").write_text(md)
    try:
        chart(res, RESULTS / "compare.png")
    except ImportError as exc:
        say(f"no chart: {exc} (pip install matplotlib)")
    if args.update_docs:
        update_docs(md)
    print(md)
    say(f"total {res['meta']['total_seconds']:.0f}s; results in {RESULTS}")


def checkout_src(ref: str) -> str:
    """``src/`` of a git revision, extracted to a temporary directory."""
    root = str(BENCH.parent)
    dest = Path(tempfile.mkdtemp(prefix="bench-sb-src-"))
    archive = subprocess.run(["git", "-C", root, "archive", ref, "src"], capture_output=True, timeout=60)
    if archive.returncode:
        raise SystemExit(f"git archive {ref} failed: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True, timeout=60)
    commit = subprocess.run(
        ["git", "-C", root, "rev-parse", "--short", ref], capture_output=True, text=True, timeout=10
    ).stdout.strip()
    os.environ["BENCH_SWITCHBOARD_COMMIT"] = commit
    return str(dest / "src")


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for pkg in ("switchboard", "hypha_rpc", "redis", "websockets", "uvicorn", "uvloop", "hiredis", "matplotlib"):
        with contextlib.suppress(Exception):
            out[pkg] = version(pkg)
    with contextlib.suppress(Exception):
        root = str(BENCH.parent)
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "src"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        out["switchboard_git"] = head + (" (src/ with uncommitted changes)" if dirty else "")
        if os.environ.get("BENCH_SWITCHBOARD_COMMIT"):
            out["switchboard_git"] = os.environ["BENCH_SWITCHBOARD_COMMIT"] + " (--switchboard-ref)"
    with contextlib.suppress(Exception):
        from switchboard.testing.valkey import find_server_binary

        out["valkey"] = subprocess.run(
            [find_server_binary(), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    return out


if __name__ == "__main__":
    main()
