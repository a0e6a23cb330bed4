"""While starting or draining, a WebSocket upgrade is refused before it is accepted.

hypha-rpc's JavaScript client (0.21.40) takes any close before
``connection_info`` as final, so an accepted-then-closed socket (the old 1013)
ended a client that redialled a draining replica. HTTP 503 is retried by it,
by hypha-rpc 0.21.47 and by Switchboard's SDK (tests/js/test_js_reconnect.py
runs the JavaScript client through a real drain).
"""

from __future__ import annotations

import pytest
import websockets

from switchboard.server.process.server_state import Phase

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("phase", [Phase.STARTING, Phase.DRAINING])
async def test_upgrade_is_refused_with_503_and_retry_after(server, phase):
    state = server.app.state.switchboard
    state.phase = phase
    try:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(server.url.replace("http", "ws") + "/ws", open_timeout=5):
                pass
    finally:
        state.phase = Phase.READY
    response = refused.value.response
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert b"retry" in response.body
    # and once ready again, the same upgrade goes through
    async with websockets.connect(server.url.replace("http", "ws") + "/ws", open_timeout=5) as ws:
        await ws.send('{"client_id": "c1", "workspace": null, "token": null, "reconnection_token": null}')
        assert "connection_info" in await ws.recv()
