"""Take docs/console.png (run it through scripts/console-screenshot)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
from pathlib import Path

from hypha_rpc import connect_to_server

from switchboard.testing import ValkeyServer
from switchboard.testing.browser import Chromium
from switchboard.testing.replica import ReplicaProcess

OUT = Path(__file__).resolve().parent / "console.png"
SECONDS = 36  # of traffic, so the charts have a shape


async def main(out: Path) -> None:
    with ValkeyServer() as valkey:
        a = ReplicaProcess(replica_id="replica-a", redis_url=valkey.url).start()
        b = ReplicaProcess(replica_id="replica-b", redis_url=valkey.url).start()
        clients = []
        try:

            async def client(url: str, **config):
                made = await connect_to_server({"server_url": url, "method_timeout": 20, **config})
                clients.append(made)
                return made

            lab = await client(a.url, client_id="imaging-worker")
            ws = lab.config["workspace"]
            token = await lab.generate_token({"permission": "read_write"})
            await lab.register_service(
                {
                    "id": "segmenter",
                    "name": "Segmenter",
                    "description": "Cuts images into labelled regions",
                    "config": {"visibility": "protected"},
                    "segment": lambda image, threshold=0.5: {"regions": 3},
                    "models": lambda: ["unet", "sam"],
                }
            )
            calc = await client(b.url, client_id="calc-worker", token=token, workspace=ws)
            await calc.register_service(
                {
                    "id": "calc",
                    "name": "Calculator",
                    "description": "Adds and multiplies",
                    "config": {"visibility": "public"},
                    "add": lambda a, b: a + b,
                    "mul": lambda a, b: a * b,
                }
            )
            viewer = await client(a.url, client_id="notebook", token=token, workspace=ws)
            await client(b.url, client_id="dashboard", token=token, workspace=ws)
            svc = await viewer.get_service(f"{ws}/calc-worker:calc")
            with Chromium(window=(1280, 900)) as browser:
                async with browser.page() as page:
                    await page.goto(f"{a.url}/console")
                    await page.evaluate(
                        f"document.getElementById('token').value = {json.dumps(token)};"
                        "document.getElementById('signin-button').click()"
                    )
                    loop = asyncio.get_running_loop()
                    end = loop.time() + SECONDS
                    rng = random.Random(7)
                    while loop.time() < end:
                        burst = int(40 + 35 * (1 + rng.random()) * (1 + (int(loop.time()) % 12) / 6))
                        await asyncio.gather(*(svc.add(i, 1) for i in range(burst)))
                        if rng.random() < 0.25:
                            with contextlib.suppress(Exception):
                                await viewer.get_service(f"{ws}/gone:missing")
                        await asyncio.sleep(0.25)
                    add = json.dumps(f'[data-service="{ws}/calc-worker:calc"] button')
                    await page.evaluate(
                        f"document.querySelector({add}).click();"
                        "document.getElementById('call-args').value = '{\"a\": 2, \"b\": 40}';"
                        "document.querySelector('#call-form button[type=submit]').click()"
                    )
                    await asyncio.sleep(2.0)
                    png = await page.screenshot(width=1280, height=900)
                    await asyncio.to_thread(out.write_bytes, png)
                    print(f"wrote {out}")
        finally:
            for made in clients:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(made.disconnect(), 5)
            a.kill()
            b.kill()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
