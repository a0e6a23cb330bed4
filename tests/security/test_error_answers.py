"""A refused manager call answers the error's type and message, never the hub's traceback.

Attack: an anonymous outsider calls the manager's functions it may not call
(another workspace's clients or record, a token it may not mint, a service
that is not there, arguments that do not bind) and reads what the refusal
says. hypha-rpc's RPC, which hosts the manager, answers an exception with its
formatted traceback: the hub's install paths, file names, line numbers and
source lines. What reaches any client is the error's type and message, as the
hypha-rpc client shows it (``RemoteError:<message>`` then ``<type>: <message>``),
on every door: WebSocket, the /rpc HTTP transport, plain HTTP.
"""

from __future__ import annotations

import os
import re
import sys

import httpx
import pytest
from hypha_rpc.rpc import RemoteException

pytestmark = pytest.mark.timeout(60)

# what a traceback gives away: where the hub is installed, its files, its lines
LEAKS = ("Traceback", 'File "', ".py", "line ", os.getcwd(), sys.prefix)

REFUSED_CALLS = {
    "another-workspaces-clients": (lambda api: api.list_clients("public"), "Permission denied for workspace public"),
    "another-workspaces-record": (
        lambda api: api.get_workspace_info("public"),
        "Permission denied for workspace public",
    ),
    "a-token-it-may-not-mint": (
        lambda api: api.generate_token({"workspace": "public", "permission": "admin"}),
        "Only admin can generate token.",
    ),
    "a-service-that-is-not-there": (lambda api: api.get_service_info("public/nobody:nothing"), "Service not found"),
    "arguments-that-do-not-bind": (lambda api: api.echo(1, 2, 3), "got multiple values for argument"),
}


def assert_bare(text: str, message: str) -> None:
    assert message in text, text
    leaked = [leak for leak in LEAKS if leak in text]
    assert not leaked, f"the refusal gives away {leaked}: {text!r}"


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_a_refused_manager_call_answers_type_and_message_without_the_hubs_traceback(
    connect, transport: str
) -> None:
    outsider = await connect(client_id="outsider", transport=transport)
    for case, (call, message) in REFUSED_CALLS.items():
        with pytest.raises(RemoteException, match=re.escape(message)) as refused:
            await call(outsider)
        text = str(refused.value)
        assert_bare(text, message)
        assert text.startswith("RemoteError:"), f"{case}: {text}"
        assert message in text.splitlines()[0], f"{case}: {text}"


async def test_the_plain_http_door_answers_type_and_message_without_a_traceback(server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        clients = await http.get("/public/services/~/list_clients", params={"workspace": "public"})
        token = await http.get(
            "/public/services/~/generate_token", params={"config": '{"workspace": "public", "permission": "admin"}'}
        )
        bad_args = await http.get("/public/services/~/echo", params={"nothing": "1"})
    for response, message in (
        (clients, "Permission denied for workspace public"),
        (token, "Only admin can generate token."),
        (bad_args, "Bad arguments for echo"),
    ):
        assert response.status_code in (400, 403), response.text
        assert_bare(response.json()["detail"], message)
