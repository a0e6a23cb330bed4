"""Choosing among several matching services, as Hypha does, with an unmodified hypha-rpc client.

Every mode of ``get_service`` / ``get_service_info`` (``exact``, ``random``,
``first``, ``last``, ``min_load``, ``native:random``,
``select:min|max|first_success:<function>``), the ``singleton`` rule,
``"~"`` for the workspace manager and ``*`` patterns in ``list_services``.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from hypha_rpc.rpc import RemoteException

from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

INVALID_MODE = (
    "Invalid mode: fastest. Mode must be 'random', 'first', 'last', 'exact', 'min_load', 'native:random', "
    "or 'select:criteria:function' format"
)


async def _providers(connect, n, *, load=None, extra=None):
    """``n`` clients in one workspace, each serving ``calc`` (and the owner's token to join it)."""
    owner = await connect(client_id="p0")
    token = await owner.generate_token()
    apis = [owner] + [await connect(client_id=f"p{i}", token=token) for i in range(1, n)]
    for i, api in enumerate(apis):
        service = {"id": "calc", "who": (lambda i=i: i)}
        if load is not None:
            service["load"] = load[i]
        service.update((extra or {}).get(i, {}))
        await api.register_service(service)
    return apis, token


async def test_exact_refuses_several_matches_and_names_the_modes(connect):
    apis, _ = await _providers(connect, 2)
    with pytest.raises(RemoteException, match="Multiple services found for .*'native:random', or use 'select:"):
        await apis[0].get_service("calc")


async def test_first_last_and_random_pick_among_the_matches(connect):
    apis, _ = await _providers(connect, 3)
    caller = apis[0]
    first = await (await caller.get_service("calc", {"mode": "first"})).who()
    last = await (await caller.get_service("calc", {"mode": "last"})).who()
    assert {first, last} <= {0, 1, 2}
    assert first != last
    seen = set()
    for _ in range(40):
        seen.add((await caller.get_service_info("calc", {"mode": "random"}))["id"])
        if len(seen) == 3:
            break
    assert len(seen) == 3


async def test_an_unknown_mode_is_refused_with_hyphas_message_even_for_one_match(connect):
    apis, _ = await _providers(connect, 1)
    with pytest.raises(RemoteException, match=INVALID_MODE.replace("(", r"\(").replace(")", r"\)")):
        await apis[0].get_service("calc", {"mode": "fastest"})
    with pytest.raises(RemoteException, match="Invalid select mode format: select:min"):
        await apis[0].get_service_info("calc", {"mode": "select:min"})
    with pytest.raises(RemoteException, match="Unknown selection criteria: median"):
        await apis[0].get_service_info("calc", {"mode": "select:median:load"})


async def test_select_min_and_max_call_the_function_on_every_candidate(connect):
    apis, _ = await _providers(connect, 3, load=[lambda: 5, lambda: 1, lambda: 9])
    caller = apis[0]
    for _ in range(5):  # not luck: the same answer every time
        assert await (await caller.get_service("calc", {"mode": "select:min:load"})).who() == 1
        assert (await caller.get_service_info("calc", {"mode": "select:max:load"}))["id"].endswith("/p2:calc")


async def test_select_first_success_skips_a_failing_candidate(connect):
    def broken():
        raise RuntimeError("not today")

    apis, _ = await _providers(connect, 2, load=[broken, lambda: "ok"])
    for _ in range(5):
        svc = await apis[0].get_service("calc", {"mode": "select:first_success:load"})
        assert await svc.who() == 1


async def test_select_asks_candidates_in_parallel_and_within_the_select_timeout(connect):
    def slow(value):
        async def load():
            await asyncio.sleep(0.8)
            return value

        return load

    async def stuck():
        await asyncio.sleep(30)
        return 0  # would be the minimum, had it answered in time

    apis, _ = await _providers(connect, 5, load=[slow(5), slow(4), slow(3), slow(1), stuck])
    started = time.monotonic()
    svc = await apis[0].get_service("calc", {"mode": "select:min:load", "select_timeout": 2.0})
    took = time.monotonic() - started
    # asked one after another (as Hypha does), p3 would be reached only after 2.4 s, past the timeout
    assert await svc.who() == 3
    assert took < 2.9, took  # the stuck one cost the timeout, not more


async def test_select_without_any_answer_falls_back_to_random(connect):
    apis, _ = await _providers(connect, 2)  # no "load" function at all
    info = await apis[0].get_service_info("calc", {"mode": "select:min:load"})
    assert info["id"].rpartition("/")[2] in ("p0:calc", "p1:calc")


async def test_select_calls_the_function_as_the_caller_not_as_the_manager(connect):
    seen = []

    def whoami(context=None):
        seen.append(context["user"]["id"])
        return 1

    apis, _ = await _providers(connect, 2, extra={0: {"config": {"require_context": True}, "load": whoami}})
    caller = apis[1]
    await caller.get_service_info("calc", {"mode": "select:min:load"})
    assert seen == [caller.config["user"]["id"]]


async def test_min_load_picks_the_provider_with_fewer_calls_in_flight(connect):
    release = asyncio.Event()

    async def hold():
        await release.wait()

    apis, token = await _providers(connect, 2, extra={0: {"hold": hold}, 1: {"hold": hold}})
    busy = await apis[0].get_service(f"{apis[0].config['workspace']}/p0:calc")
    held = [asyncio.ensure_future(busy.hold()) for _ in range(3)]
    caller = await connect(client_id="caller", token=token)
    try:
        for _ in range(12):  # a coin would pick p0 within a dozen tries
            svc = await caller.get_service("calc", {"mode": "min_load"})
            assert await svc.who() == 1
    finally:
        release.set()
        await asyncio.gather(*held)

    # the calls are over: p0 is idle again and may be chosen
    async def p0_chosen() -> bool:
        info = await caller.get_service_info("calc", {"mode": "min_load"})
        return info["id"].endswith("/p0:calc")

    await eventually(p0_chosen, "the idle p0 chosen again", timeout=10)


async def test_native_random_on_one_hub_chooses_among_all(connect):
    apis, _ = await _providers(connect, 2)
    info = await apis[0].get_service_info("calc", {"mode": "native:random"})
    assert info["id"].rpartition("/")[2] in ("p0:calc", "p1:calc")


async def test_a_singleton_service_is_the_only_one_of_its_name(connect):
    owner = await connect(client_id="one")
    token = await owner.generate_token()
    other = await connect(client_id="two", token=token)
    await owner.register_service({"id": "solo", "config": {"singleton": True}, "f": lambda: 1})
    await owner.register_service(  # itself, again
        {"id": "solo", "config": {"singleton": True}, "f": lambda: 2}, {"overwrite": True}
    )
    with pytest.raises(
        Exception,  # hypha-rpc re-raises the manager's refusal of a registration as a plain Exception
        match=r"A singleton service with the same name \(solo\) has already exists in the workspace",
    ):
        await other.register_service({"id": "solo", "f": lambda: 3})
    await other.register_service({"id": "pair", "f": lambda: 1})
    with pytest.raises(
        Exception, match=r"A singleton service with the same name \(pair\) already exists in the workspace"
    ):
        await owner.register_service({"id": "pair", "config": {"singleton": True}, "f": lambda: 2})
    ids = {s["id"].rpartition("/")[2] for s in await owner.list_services()}
    assert "one:solo" in ids
    assert "two:solo" not in ids
    assert "one:pair" not in ids


async def test_tilde_names_the_workspace_manager(connect):
    api = await connect(client_id="tilde")
    ws = api.config["workspace"]
    info = await api.get_service_info("~")
    assert info["id"] == "~"
    assert "list_services" in info["service_schema"]
    assert (await api.get_service_info(f"{ws}/~"))["id"] == "~"
    manager = await api.get_service("~")
    assert await manager.echo("hi") == "hi"
    await api.register_service({"id": "via-tilde", "f": lambda: 1})
    assert f"{ws}/tilde:via-tilde" in {s["id"] for s in await manager.list_services()}


async def test_tilde_over_http_gives_the_managers_info_and_functions(connect, server):
    api = await connect(client_id="tilde")
    ws = api.config["workspace"]
    token = await api.generate_token()
    async with httpx.AsyncClient(base_url=server.url) as http:
        got = await http.get(f"/{ws}/services/~", headers={"Authorization": f"Bearer {token}"})
        called = await http.get(f"/{ws}/services/~/echo?data=1", headers={"Authorization": f"Bearer {token}"})
    assert got.status_code == 200, got.text
    assert got.json()["id"] == "~"
    # its functions run as the request's user (tests/server/test_manager_over_http.py)
    assert called.status_code == 200, called.text
    assert called.json() == 1


async def test_http_mode_picks_among_several_and_refuses_an_unknown_one(connect, server):
    apis, token = await _providers(connect, 2, load=[lambda: 4, lambda: 2])
    ws = apis[0].config["workspace"]
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=server.url) as http:
        several = await http.get(f"/{ws}/services/calc/who", headers=auth)
        chosen = await http.get(f"/{ws}/services/calc/who?_mode=select:min:load", headers=auth)
        unknown = await http.get(f"/{ws}/services/calc/who?_mode=fastest", headers=auth)
    assert several.status_code == 400
    assert "Multiple services found" in several.text
    assert chosen.status_code == 200
    assert chosen.json() == 1
    assert unknown.status_code == 400
    assert "Invalid mode: fastest" in unknown.text


async def test_list_services_takes_patterns_in_query_values(connect):
    api = await connect(client_id="globber")
    ws = api.config["workspace"]
    for sid, kind in (("calc-add", "math"), ("calc-mul", "math"), ("echo", "text")):
        await api.register_service({"id": sid, "type": kind, "f": lambda: 1})

    def names(found):
        return sorted(s["id"].rpartition(":")[2] for s in found)

    assert names(await api.list_services({"service_id": "calc*"})) == ["calc-add", "calc-mul"]
    assert names(await api.list_services({"service_id": "*-mul"})) == ["calc-mul"]
    assert names(await api.list_services({"type": "ma*"})) == ["calc-add", "calc-mul"]
    assert names(await api.list_services({"client_id": "glob*", "type": "text"})) == ["echo"]
    assert names(await api.list_services(f"{ws}/glob*:*c*")) == ["calc-add", "calc-mul", "echo"]
    assert names(await api.list_services({"workspace": ws[:8] + "*", "service_id": "echo"})) == ["echo"]
    with pytest.raises(RemoteException, match="invalid service id .calc\\?."):
        await api.list_services({"service_id": "calc?"})
