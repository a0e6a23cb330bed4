"""``ping`` tells whether a client is connected only to those who may read its workspace (issue 21, item 8).

Before, ``ping("W/client")`` from any workspace answered ``pong`` for a
connected client and "not connected" otherwise: anyone could watch who is
online in W. As in Hypha (``ping_client``), a ping into a workspace needs
``read`` there, and a refusal reads the same whether the client is
connected or not; like Hypha's, it is an answer string, never an exception.
The wait has a documented maximum (``MAX_PING_TIMEOUT``): a longer one is
refused, so a ping cannot hold the manager longer than a call may wait.

The attackers are real hypha-rpc clients: an anonymous outsider in its own
workspace, and a member (read-write) of another workspace.
"""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.hub.manager import manager

pytestmark = pytest.mark.timeout(60)

MAX_PING_TIMEOUT = getattr(manager, "MAX_PING_TIMEOUT", 30.0)


async def victim(connect: Any) -> tuple[str, Any]:
    """Workspace W, with its owner and a connected client ``target``."""
    owner = await connect(client_id="owner")
    ws = owner.config["workspace"]
    await connect(client_id="target", token=await owner.generate_token())
    return ws, owner


async def test_an_outsider_cannot_tell_whether_a_client_of_w_is_connected(connect: Any) -> None:
    ws, _ = await victim(connect)
    outsider = await connect(client_id="outsider")
    for target in (f"{ws}/target", f"{ws}/nobody", f"{ws}/owner"):
        answer = await outsider.ping(target)
        assert answer == f"Failed to ping client {target}: Permission denied for workspace {ws}"


async def test_a_member_of_another_workspace_cannot_either(connect: Any) -> None:
    ws, _ = await victim(connect)
    other_owner = await connect(client_id="other-owner")
    member = await connect(client_id="member", token=await other_owner.generate_token())
    assert member.config["workspace"] == other_owner.config["workspace"] != ws
    assert await member.ping("other-owner") == "pong"  # its own workspace: allowed
    for target in (f"{ws}/target", f"{ws}/nobody"):
        answer = await member.ping(target)
        assert answer == f"Failed to ping client {target}: Permission denied for workspace {ws}"


async def test_a_member_with_read_on_w_gets_pong_and_not_connected(connect: Any) -> None:
    ws, owner = await victim(connect)
    reader = await connect(client_id="reader", token=await owner.generate_token({"permission": "read"}))
    assert await reader.ping(f"{ws}/target") == "pong"
    assert await reader.ping("target") == "pong"
    assert "not connected" in await reader.ping(f"{ws}/nobody")


async def test_the_timeout_has_a_documented_maximum(connect: Any) -> None:
    ws, owner = await victim(connect)
    assert await owner.ping(f"{ws}/target", MAX_PING_TIMEOUT) == "pong"
    for timeout in (MAX_PING_TIMEOUT + 1, 10**9, float("inf"), float("nan"), 0, -1, "5", True):
        answer = await owner.ping(f"{ws}/target", timeout)
        assert answer == (
            f"Failed to ping client {ws}/target: timeout must be a number of seconds above 0 "
            f"and at most {MAX_PING_TIMEOUT:g}"
        ), timeout
