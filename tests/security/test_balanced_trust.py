"""A balanced handle crosses the trust boundary exactly as a direct call does (issue 41 item 3).

The victim workspace ``W`` has three instances of ``calc``: ``p0`` public,
``p1`` protected, ``p2`` protected but shared with the outsider's workspace
(``authorized_workspaces``). Each records who called it. An outsider (an
anonymous client of its own workspace) and a member with a read-only token
look ``W/calc`` up with a balance mode: their calls reach only the instances
each could have looked up itself, as itself; and nobody can call through a
handle it did not look up, even knowing its address.
"""

from __future__ import annotations

import collections

import pytest
from hypha_rpc.rpc import RemoteException

pytestmark = pytest.mark.timeout(60)

CONFIGS = (
    {"visibility": "public"},
    {"visibility": "protected"},
    {"visibility": "protected"},  # authorized_workspaces filled in once the outsider's workspace is known
)


async def _victim(connect, outsider_ws):
    owner = await connect(client_id="p0")
    ws = owner.config.workspace
    token = await owner.generate_token()
    apis = [owner] + [await connect(client_id=f"p{i}", token=token) for i in (1, 2)]
    calls = collections.defaultdict(list)
    for i, api in enumerate(apis):
        config = dict(CONFIGS[i], require_context=True)
        if i == 2:
            config["authorized_workspaces"] = [outsider_ws]

        def who(context=None, i=i):
            calls[i].append(context["from"])
            return i

        await api.register_service({"id": "calc", "config": config, "who": who})
    return ws, owner, calls


async def _reachable_directly(caller, ws):
    """The instances ``caller`` can look up by their own ids."""
    out = set()
    for i in range(3):
        try:
            await caller.get_service_info(f"{ws}/p{i}:calc")
        except RemoteException:
            continue
        out.add(i)
    return out


async def test_an_outsiders_balanced_handle_reaches_only_the_instances_it_may_look_up(connect):
    outsider = await connect(client_id="outsider")
    ws, _, calls = await _victim(connect, outsider.config.workspace)
    allowed = await _reachable_directly(outsider, ws)
    assert allowed == {0, 2}  # public, and shared with its workspace
    calc = await outsider.get_service(f"{ws}/calc", {"mode": "balance:round_robin"})
    answers = {await calc.who() for _ in range(12)}
    assert answers == allowed
    assert calls[1] == []  # the protected instance never ran
    assert set(calls[0] + calls[2]) == {f"{outsider.config.workspace}/outsider"}  # seen as itself


async def test_a_read_only_member_reaches_what_a_direct_lookup_lets_it(connect):
    probe = await connect(client_id="probe")
    ws, owner, calls = await _victim(connect, probe.config.workspace)
    weak = await owner.generate_token({"permission": "read"})
    member = await connect(client_id="reader", token=weak)
    allowed = await _reachable_directly(member, ws)
    calc = await member.get_service("calc", {"mode": "balance:least_busy"})
    answers = {await calc.who() for _ in range(12)}
    assert answers <= allowed
    assert {c for i in answers for c in calls[i]} == {f"{ws}/reader"}


async def test_an_outsider_is_refused_a_balanced_handle_on_protected_instances_as_on_a_direct_lookup(connect):
    owner = await connect(client_id="p0")
    await owner.register_service({"id": "secret", "config": {"visibility": "protected"}, "x": lambda: 1})
    outsider = await connect(client_id="outsider")
    with pytest.raises(RemoteException) as direct:
        await outsider.get_service(f"{owner.config.workspace}/secret")
    with pytest.raises(RemoteException) as balanced:
        await outsider.get_service(f"{owner.config.workspace}/secret", {"mode": "balance:round_robin"})
    assert "Permission denied for non-public service" in str(direct.value)
    assert "Permission denied for non-public service" in str(balanced.value)


async def test_nobody_calls_through_a_handle_it_did_not_look_up(connect):
    outsider = await connect(client_id="outsider")
    ws, owner, calls = await _victim(connect, outsider.config.workspace)
    victim_handle = await owner.get_service("calc", {"mode": "balance:round_robin"})
    address = victim_handle["id"]  # the handle's address: known, or guessed
    with pytest.raises(Exception, match="is a balanced handle: it takes calls only, from the connection that looked"):
        await outsider.rpc.get_remote_service(address)
    member = await connect(client_id="member", token=await owner.generate_token())
    with pytest.raises(Exception, match="is a balanced handle"):
        await member.rpc.get_remote_service(address)
    assert not any(calls.values())  # no instance ran anything


async def test_no_client_may_take_a_handles_address(connect):
    with pytest.raises(Exception, match="is reserved: 'balance"):
        await connect(client_id="balance|round_robin|calc")
