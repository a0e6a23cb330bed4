"""A balanced handle crosses the trust boundary exactly as a direct call does (issue 41 item 3).

The victim workspace ``W`` has three instances of ``calc``: ``p0`` public,
``p1`` protected, ``p2`` protected but shared with the outsider's workspace
(``authorized_workspaces``). Each records who called it. An outsider (an
anonymous client of its own workspace) and a member with a read-only token
look ``W/calc`` up with a balance mode: their calls reach only the instances
each could have looked up itself, as itself; and a call to a handle's address
made without a lookup (a caller back on another replica, or a stranger who
crafted it) is bound by the caller's own lookup: it reaches what that lookup
would, and is refused as that lookup would be.
"""

from __future__ import annotations

import collections

import pytest
from hypha_rpc.rpc import RemoteException

from support.sealed import Raw, pack

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


async def test_a_call_to_a_handles_address_reaches_only_what_the_callers_own_lookup_would(connect, server):
    """A handle's address is no secret: whoever calls it without having looked it up here (a caller
    back on another replica, or anyone who guessed it) has it bound by its own lookup, as it is now."""
    outsider = await Raw.open(server.url, "outsider")
    try:
        outsider_ws = outsider.id.partition("/")[0]
        ws, owner, calls = await _victim(connect, outsider_ws)
        address = (await owner.get_service("calc", {"mode": "balance:round_robin"}))["id"].partition(":")[0]
        answers = [await outsider.ask(address, "services.calc.who", {"args": []}) for _ in range(12)]
    finally:
        await outsider.close()
    assert {kind for kind, _ in answers} == {"resolve"}, answers
    assert {int(value) for _, value in answers} == {0, 2}  # public, and shared with its workspace
    assert calls[1] == []  # the protected instance never ran
    assert set(calls[0] + calls[2]) == {outsider.id}  # seen as itself


async def test_a_strangers_crafted_call_to_a_handle_of_a_workspace_it_cannot_see_gets_its_own_lookups_refusal(
    connect, server
):
    owner = await connect(client_id="p0")
    ws, ran = owner.config.workspace, []
    await owner.register_service(
        {"id": "secret", "config": {"visibility": "protected"}, "x": lambda: ran.append(1) or 1}
    )
    handle = f"{ws}/balance|round_robin|secret"
    stranger = await Raw.open(server.url, "stranger")
    try:
        manager = f"*/{server.hub.manager_id}"
        lookup = await stranger.ask(
            manager, "services.default.get_service", {"args": [f"{ws}/secret", {"mode": "balance:round_robin"}]}
        )
        crafted = await stranger.ask(handle, "services.secret.x", {"args": []})
        again = await stranger.ask(handle, "services.secret.x", {"args": []})  # no handle was made: refused again
    finally:
        await stranger.close()
    assert lookup[0] == crafted[0] == again[0] == "reject"
    reason = "Permission denied for non-public service"
    assert reason in lookup[1], lookup
    assert reason in crafted[1], crafted
    assert reason in again[1], again
    assert crafted[1] in lookup[1]  # the lookup's own error, word for word
    assert ran == []
    assert not server.hub.router.balanced.pools()


async def test_no_client_may_take_a_handles_address(connect):
    with pytest.raises(Exception, match="is reserved: 'balance"):
        await connect(client_id="balance|round_robin|calc")


async def test_no_client_may_wrap_its_call_as_a_replica_does_a_balanced_one(connect, server):
    """Between replicas a balanced call carries its handle, and the instance's replica then labels
    the instance's answers with it: only a replica's origin tag on the bus marks one, so a client's
    frame shaped as the hub wraps such a call (``\\x02 handle \\n call``) is no call at all."""
    outsider = await Raw.open(server.url, "outsider")
    try:
        ws, _, calls = await _victim(connect, outsider.id.partition("/")[0])
        handle = f"{ws}/balance|round_robin|calc"
        call = {"type": "method", "to": f"{ws}/p0", "method": "services.calc.who", "session": "forged"}
        await outsider.ws.send(b"\x02" + handle.encode() + b"\n" + pack(call) + pack({"args": []}))
        kind, value = await outsider.ask(f"{ws}/p0", "services.calc.who", {"args": []})  # behind it, in order
    finally:
        await outsider.close()
    assert (kind, value) == ("resolve", "0")
    assert calls[0] == [outsider.id]  # the plain call ran, the wrapped one never did
    assert len(server.hub.router.served) == 0  # and no instance's answer speaks for the handle
