"""A page of another origin of the hub's site cannot drive a visitor's HTTP-streaming session.

The visitor's tab runs hypha-rpc's JavaScript client on the hub's own origin
over HTTP streaming, anonymous: the stream's cookie is its only credential. A
second tab of the same visitor (same cookie jar) shows a page of another port
of 127.0.0.1: another origin, the same site, so ``SameSite=Strict`` lets the
browser send the cookie with it. That page posts a call into the visitor's
stream with a ``no-cors`` fetch, which needs no preflight. The hub must refuse
it; the provider must see only the visitor's own calls.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import msgpack
import pytest

pytestmark = [pytest.mark.timeout(90)]

BUNDLE = Path(__file__).resolve().parents[2] / ".cache/js/node_modules/hypha-rpc/dist/hypha-rpc-websocket.min.js"
HUB_PAGE = "/health/liveness"  # any document of the hub's origin: the client is loaded into it


async def _start_visitor(page, hub_url: str, witness: str) -> str:
    """hypha-rpc's browser bundle on the hub's own origin, connected over HTTP streaming; its peer id."""
    await page.goto(hub_url + HUB_PAGE)
    await page.evaluate(BUNDLE.read_text() + "\n;0")
    return await page.evaluate(
        f"""(async () => {{
            window.visitor = await hyphaWebsocketClient.connectToServer(
                {{server_url: {json.dumps(hub_url)}, transport: "http", client_id: "visitor", method_timeout: 20}});
            window.witness = await window.visitor.getService({json.dumps(witness)});
            await window.witness.who("own call");
            return `${{window.visitor.config.workspace}}/${{window.visitor.config.client_id}}`;
        }})()"""
    )


async def test_a_sibling_origin_cannot_post_into_a_visitors_stream(chromium, static_server, server, connect, caplog):
    caplog.set_level(logging.INFO, logger="switchboard.server.http.http_rpc")
    seen: list[tuple[str, str]] = []

    def who(tag, context=None):
        seen.append((tag, context["from"]))
        return tag

    provider = await connect(client_id="prov")
    witness = f"{provider.config['workspace']}/prov:witness"
    await provider.register_service(
        {"id": "witness", "config": {"visibility": "public", "require_context": True}, "who": who}
    )
    async with chromium.tabs(2) as (visitor_tab, sibling_tab):
        visitor = await _start_visitor(visitor_tab, server.url, witness)
        assert seen == [("own call", visitor)], "the same-origin client works, with its cookie"

        # the sibling page (127.0.0.1, another port) posts a call as the visitor
        workspace, _, client_id = visitor.partition("/")
        forged = msgpack.packb(
            {"type": "method", "to": f"{witness.partition(':')[0]}", "method": "services.witness.who"}
        )
        forged += msgpack.packb({"args": ["forged by the sibling page"]})
        await sibling_tab.goto(static_server.url + "/package.json")
        assert static_server.url != server.url
        kind = await sibling_tab.evaluate(
            f"""fetch({json.dumps(f"{server.url}/rpc?workspace={workspace}&client_id={client_id}")}, {{
                method: "POST", mode: "no-cors", credentials: "include", body: new Uint8Array({list(forged)}),
            }}).then((response) => response.type)"""
        )
        assert kind == "opaque", "the request went out and was answered"

        # the visitor's next call reaches the provider after anything the sibling's POST could have sent
        await visitor_tab.evaluate('window.witness.who("next own call")')
        assert seen == [("own call", visitor), ("next own call", visitor)], "nothing from the sibling page"
        refusals = [r.getMessage() for r in caplog.records if "POST /rpc refused (403)" in r.getMessage()]
        assert any("another origin (Sec-Fetch-Site: same-site)" in m for m in refusals), refusals
        errors = [e for e in visitor_tab.errors() if not e.url.endswith("/favicon.ico")]  # the hub serves none
        assert not errors, [e.text for e in errors]
