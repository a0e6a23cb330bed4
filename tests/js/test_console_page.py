"""The web console in headless Chromium: loads clean, follows the hub live, signs in, calls a function."""

from __future__ import annotations

import json

import pytest

from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.timeout(60)]


def _exists(selector: str) -> str:
    return f"!!document.querySelector({json.dumps(selector)})"


async def test_console_follows_the_hub_and_calls_a_function(js_tools, chromium, server, connect):
    async with chromium.page() as page:
        await page.goto(f"{server.url}/console")
        await eventually(lambda: page.evaluate("document.body.dataset.updated"), timeout=5, what="first update")
        assert await page.evaluate("document.getElementById('viewer').textContent") == "anonymous"

        # a service a test client registers shows within 2 s
        provider = await connect(client_id="prov")
        ws = provider.config["workspace"]
        await provider.register_service({"id": "calc", "config": {"visibility": "public"}, "add": lambda a, b: a + b})
        await provider.register_service({"id": "vault", "config": {"visibility": "protected"}, "peek": lambda: "s"})
        calc = f'[data-service="{ws}/prov:calc"]'
        await eventually(lambda: page.evaluate(_exists(calc)), timeout=2.0, what="the new service on the page")
        assert not await page.evaluate(_exists(f'[data-service="{ws}/prov:vault"]')), "protected: not for anonymous"
        assert not await page.evaluate(_exists(f'[data-client="{ws}/prov"]')), "clients: not for anonymous"

        # signed in with a token for the workspace: its clients and protected services too
        token = await provider.generate_token({"permission": "read"})
        await page.evaluate(
            f"document.getElementById('token').value = {json.dumps(token)};"
            "document.getElementById('signin-button').click()"
        )
        await eventually(
            lambda: page.evaluate(_exists(f'[data-service="{ws}/prov:vault"]')),
            timeout=3,
            what="the protected service after signing in",
        )
        assert await page.evaluate(_exists(f'[data-client="{ws}/prov"]'))
        assert await page.evaluate("document.getElementById('viewer').textContent") != "anonymous"

        # a function called with JSON arguments
        add_button = json.dumps(calc + ' button[title="call add"]')
        await page.evaluate(
            f"document.querySelector({add_button}).click();"
            "document.getElementById('call-args').value = '{\"a\": 2, \"b\": 3}';"
            "document.querySelector('#call-form button[type=submit]').click()"
        )
        result = await eventually(
            lambda: page.evaluate("document.getElementById('call-result').textContent.trim() === '5'"),
            timeout=5,
            what="the call's result",
        )
        assert result

        # a client that leaves is gone from the page
        await provider.disconnect()
        await eventually(lambda: page.evaluate(f"!{_exists(calc)}"), timeout=3, what="the service gone")
        client = f'[data-client="{ws}/prov"]'
        await eventually(lambda: page.evaluate(f"!{_exists(client)}"), timeout=3, what="the client gone")

        assert not page.errors(), [e.text for e in page.errors()]
        loaded = await page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        assert loaded
        assert all(url.startswith(server.url + "/") for url in loaded), "nothing from another origin"


async def test_a_function_name_is_one_encoded_path_segment_and_never_a_dot_segment(js_tools, chromium, server, connect):
    """A provider names its functions; the console must not let a name steer its POST elsewhere.

    ``a/b`` is one segment, encoded; ``..`` is a dot segment that the browser
    would resolve (``%2e%2e`` too), so it cannot be named in a URL at all: the
    console says so and sends nothing with the viewer's token.
    """
    provider = await connect(client_id="prov")
    ws = provider.config["workspace"]
    called: list[str] = []

    def slash() -> str:
        called.append("a/b")
        return "slash"

    await provider.register_service(
        {"id": "odd", "config": {"visibility": "public"}, "a/b": slash, "..": lambda: "dots", "ok": lambda: "ok"}
    )
    async with chromium.page() as page:
        await page.goto(f"{server.url}/console")
        row = f'[data-service="{ws}/prov:odd"]'
        await eventually(lambda: page.evaluate(_exists(row)), timeout=5, what="the service on the page")
        await page.evaluate(
            "window.posted = []; const send = window.fetch;"
            "window.fetch = (url, init) => {"
            "  if (init && init.method === 'POST') window.posted.push(new URL(url, location.href).pathname);"
            "  return send(url, init); }"
        )

        async def call(name: str) -> str:
            button = json.dumps(f"{row} button[title={json.dumps('call ' + name)}]")
            await page.evaluate(
                f"document.querySelector({button}).click();"
                "document.getElementById('call-args').value = '{}';"
                "document.querySelector('#call-form button[type=submit]').click()"
            )
            settled = "(t => t && t !== 'calling…')(document.getElementById('call-result').textContent.trim())"
            await eventually(lambda: page.evaluate(settled), timeout=5, what=f"the result of {name}")
            return await page.evaluate("document.getElementById('call-result').textContent.trim()")

        assert await call("a/b") == '"slash"'
        assert called == ["a/b"]
        assert await page.evaluate("window.posted") == [f"/{ws}/services/prov%3Aodd/a%2Fb"]

        refused = await call("..")
        assert "cannot be called over HTTP" in refused, refused
        assert await page.evaluate("window.posted") == [f"/{ws}/services/prov%3Aodd/a%2Fb"], "nothing sent for '..'"
        assert await call("ok") == '"ok"'
