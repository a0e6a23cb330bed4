"""Run hypha-rpc's own JavaScript browser tests against Switchboard, once, in headless Chromium.

Not part of the suite (``scripts/hypha-rpc-js-suite`` runs it). Where the
tests come from: the npm package hypha-rpc@0.21.40 (in ``.cache/js``) ships
no tests of its own, but carries the tarball of hypha-rpc 0.21.15, whose
``dist/`` holds its karma-webpack build: ``commons.js`` (the 0.21.15 client,
chai and the test modules) plus one small entry chunk per test file. They
are loaded unchanged into a page next to mocha's browser build (npm, into
``.cache/js-upstream``), with Switchboard on 127.0.0.1:9394, the port they
expect, and the page on another origin (as under karma).

Left out: WebRTC tests (they need a STUN server on the internet) and
``server_compatibility_test`` (it dials a public Hypha server). The login
tests run: they fill a key of ``public/hypha-login`` through its
``report_url`` with a token they made, so they need no provider. Chromium
also resolves no host name but loopback.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from switchboard.server.runner import running
from switchboard.testing.browser import Chromium, StaticServer
from switchboard.testing.hub import settings_for_tests

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "js-upstream"
NESTED = ROOT / ".cache" / "js" / "node_modules" / "hypha-rpc" / "hypha-rpc-0.21.15.tgz"
CHUNKS = ("utils_test", "memory_leak_test", "http_client_test", "websocket_client_test")
SKIP = "webrtc"
PORT = 9394

PAGE = """<!doctype html><meta charset="utf-8"><title>hypha-rpc tests</title><link rel="icon" href="data:,">
<div id="mocha"></div>
<script src="/mocha/mocha.js"></script>
<script>
  mocha.setup({ui: "bdd", timeout: 30000, grep: /%(skip)s/i, invert: true});
  window.results = {passes: [], failures: [], pending: [], done: false};
</script>
<script src="/dist/runtime.js"></script>
<script src="/dist/commons.js"></script>
%(chunks)s
<script>
  const runner = mocha.run();
  const started = {};
  runner.on("test", (t) => { started[t.fullTitle()] = performance.now(); });
  runner.on("pass", (t) => results.passes.push({title: t.fullTitle(), ms: Math.round(performance.now() - started[t.fullTitle()])}));
  runner.on("fail", (t, err) => results.failures.push({title: t.fullTitle(), error: String(err && (err.stack || err.message) || err).slice(0, 1200)}));
  runner.on("pending", (t) => results.pending.push(t.fullTitle()));
  runner.on("end", () => { results.done = true; });
</script>
"""


def prepare(only: tuple[str, ...] = CHUNKS) -> Path:
    """The 0.21.15 tarball unpacked and mocha installed, once; the page runs the test files ``only``."""
    dist = CACHE / "package" / "dist"
    if not dist.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tarfile.open(NESTED) as tar:
            tar.extractall(CACHE, filter="data")
    if not (CACHE / "node_modules" / "mocha" / "mocha.js").exists():
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(CACHE), "mocha@10.8.2"],
            check=True,
            stdin=subprocess.DEVNULL,
        )
    chunk_files = {c: sorted(dist.glob(f"{c}.*.js")) for c in only}
    tags = "\n".join(f'<script src="/dist/{files[0].name}"></script>' for files in chunk_files.values())
    (CACHE / "index.html").write_text(PAGE % {"skip": SKIP, "chunks": tags})
    return dist


async def main(only: tuple[str, ...] = CHUNKS, *, allow_encrypted: bool = False) -> int:
    dist = prepare(only)
    # the end-to-end encryption tests need a hub that lets sealed payloads through (refused by default)
    settings = settings_for_tests(port=PORT, allow_encrypted_payloads=allow_encrypted)
    started = time.monotonic()
    async with running(settings) as server:
        with (
            StaticServer({"/": CACHE, "/dist/": dist, "/mocha/": CACHE / "node_modules" / "mocha"}) as static,
            Chromium(extra_args=("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",)) as browser,
        ):
            async with browser.page() as page:
                await page.goto(f"{static.url}/index.html")
                deadline = time.monotonic() + 900
                while time.monotonic() < deadline:
                    results = await page.evaluate("window.results")
                    if results and results["done"]:
                        break
                    await asyncio.sleep(1)
                results = await page.evaluate("window.results")
        print(f"server {server.url}, page {static.url}")
    took = time.monotonic() - started
    out = CACHE / "results.json"
    out.write_text(json.dumps(results, indent=2))
    for failure in results["failures"]:
        print(f"FAIL {failure['title']}\n    {failure['error'].splitlines()[0] if failure['error'] else ''}")
    print(
        f"{len(results['passes'])} passed, {len(results['failures'])} failed, "
        f"{len(results['pending'])} skipped in {took:.0f}s (done={results['done']}); details in {out}"
    )
    return 0 if not results["failures"] else 1


if __name__ == "__main__":
    if shutil.which("npm") is None:
        sys.exit("npm is needed: run scripts/js-deps")
    # arguments: run only these test files, e.g. http_client_test; --allow-encrypted-payloads as the hub's
    flag = "--allow-encrypted-payloads"
    files = tuple(a for a in sys.argv[1:] if a != flag)
    sys.exit(asyncio.run(main(files or CHUNKS, allow_encrypted=flag in sys.argv[1:])))
