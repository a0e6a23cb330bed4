"""HTTP callers are held to a connection's bounds, and a selection's fan-out counts against them.

The attack: one anonymous ``GET /W/services/*:calc/add?_mode=select:max:load&_select_timeout=60``
ran ``load()`` on every provider of ``calc`` (up to 64), so 100 concurrent GETs held 6,400 calls
at the providers, and a few looping GETs slowed everyone else's calls. Now an HTTP request is a
call of its user (an anonymous one: of its address), under the rate (``--max-messages-per-second``,
``--message-burst``) and the calls in flight (``--max-pending-calls``) a connection has, and each
candidate a ``select:`` lookup asks is one more call of the asker, over HTTP or WebSocket. Past a
bound the answer is a fast 429 that says which bound, with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server
from hypha_rpc.rpc import RemoteException

from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually, scaled

pytestmark = pytest.mark.timeout(60)

PROVIDERS = 8
SELECT = "*:calc/add?_mode=select:max:load&_select_timeout=60&a=1&b=2"
# the same selection through the manager: GET /W/services/~/get_service_info?service_id=W/*:calc&config=...
SELECT_BY_MANAGER = '~/get_service_info?service_id={ws}/*:calc&config={{"mode":"select:max:load","select_timeout":60}}'


class Pool:
    """``PROVIDERS`` clients of one workspace serving public ``calc``; ``load()`` counts its calls
    and, while ``hold`` is clear, waits for it (a provider that answers slowly)."""

    def __init__(self, srv: RunningServer) -> None:
        self.srv = srv
        self.clients: list[Any] = []
        self.loads = 0
        self.loading = 0
        self.hold = asyncio.Event()
        self.hold.set()
        self.ws = ""

    async def start(self) -> Pool:
        owner = await self.connect(client_id="p0")
        self.ws = owner.config["workspace"]
        token = await owner.generate_token()
        await asyncio.gather(*(self.connect(client_id=f"p{i}", token=token) for i in range(1, PROVIDERS)))
        for client in self.clients:
            await client.register_service(
                {"id": "calc", "config": {"visibility": "public"}, "load": self.load, "add": lambda a, b: a + b}
            )
        return self

    async def connect(self, **config: Any) -> Any:
        client = await connect_to_server({"server_url": self.srv.url, "method_timeout": 30, **config})
        self.clients.append(client)
        return client

    async def load(self) -> int:
        self.loads += 1
        self.loading += 1
        try:
            await self.hold.wait()
        finally:
            self.loading -= 1
        return self.loads

    async def close(self) -> None:
        self.hold.set()
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 5)


@contextlib.asynccontextmanager
async def pool(**limits: Any) -> AsyncIterator[Pool]:
    async with running(settings_for_tests(**limits)) as srv:
        made = Pool(srv)
        try:
            yield await made.start()
        finally:
            await made.close()


def _refused_fast(answer: httpx.Response, bound: str) -> None:
    assert answer.status_code == 429, answer.text
    assert bound in answer.json()["detail"], answer.text
    assert int(answer.headers["Retry-After"]) >= 1
    assert answer.elapsed.total_seconds() < scaled(2), "refused at once, not after the providers answered"


@pytest.mark.parametrize("door", [SELECT, SELECT_BY_MANAGER], ids=["service", "manager"])
async def test_concurrent_selections_hold_no_more_provider_calls_than_one_caller_may(door):
    """30 concurrent anonymous select: GETs over 8 providers whose load() hangs: they would hold
    240 calls at the providers. At most 20 calls in flight per caller, a request and each candidate
    it asks one call: at most two selections (1 + 8 calls each) hold their candidates, every other
    request is refused at once, while those still wait."""
    async with pool(max_pending_calls=20) as p, httpx.AsyncClient(base_url=p.srv.url, timeout=90) as http:
        p.hold.clear()
        answered: list[httpx.Response] = []

        async def get() -> None:
            answered.append(await http.get(f"/{p.ws}/services/{door.format(ws=p.ws)}"))

        def settled() -> bool:  # every request refused, or holding its 8 candidates' calls
            return len(answered) >= 28 and len(answered) + p.loading // PROVIDERS == 30

        flood = [asyncio.ensure_future(get()) for _ in range(30)]
        try:
            await eventually(settled, "the requests past the bound refused while the others wait", timeout=10)
            assert p.loading <= 2 * PROVIDERS, "no more than two selections hold their candidates' calls"
            for answer in answered:
                _refused_fast(answer, "Too many calls in flight")
            assert "anonymous requests from 127.0.0.1" in answered[0].json()["detail"]
        finally:
            p.hold.set()
            await asyncio.gather(*flood)
        held = p.loads // PROVIDERS
        assert p.loads == held * PROVIDERS <= 2 * PROVIDERS
        assert sorted(a.status_code for a in answered) == [200] * held + [429] * (30 - held)
        again = await http.get(f"/{p.ws}/services/{door.format(ws=p.ws)}")
        assert again.status_code == 200, "room again once they are done"


async def test_a_selection_flood_is_held_to_the_callers_rate_and_a_bystander_is_served():
    """8 anonymous workers looping select: GETs: each GET costs 1 + 8 calls of the rate, so the
    providers see at most the burst and the rate's worth of load() calls; the refusals come
    fast; a signed-in HTTP caller and a WebSocket client, other callers, are served meanwhile."""
    rate, burst = 20, 40
    async with pool(max_messages_per_second=rate, message_burst=burst) as p:
        async with httpx.AsyncClient(base_url=p.srv.url, timeout=30) as http:
            bystander = await p.connect(client_id="bystander")
            user_token = await bystander.generate_token()
            calc = await bystander.get_service(f"{p.ws}/p3:calc")
            codes: list[int] = []
            loop = asyncio.get_running_loop()
            started = loop.time()

            async def worker() -> None:
                for _ in range(15):
                    answer = await http.get(f"/{p.ws}/services/{SELECT}")
                    codes.append(answer.status_code)
                    if answer.status_code == 429:
                        _refused_fast(answer, "Rate limit exceeded")

            workers = asyncio.gather(*(worker() for _ in range(8)))
            served = []
            while not workers.done() and len(served) < burst // 2:  # within its own rate: 2 calls a turn
                served.append(await calc.add(len(served), 1))
                signed_in = await http.get(
                    f"/{p.ws}/services/p5:calc/add?a=2&b=2", headers={"Authorization": f"Bearer {user_token}"}
                )
                assert signed_in.status_code == 200, signed_in.text
            await workers
            elapsed = loop.time() - started
            await bystander.disconnect()
        assert served == [i + 1 for i in range(len(served))]
        assert codes.count(429) > codes.count(200) > 0, codes
        # 120 GETs would have made 960 load() calls; the rate lets through burst + rate x time
        assert p.loads <= burst + rate * elapsed + PROVIDERS, (p.loads, elapsed)


async def test_a_websocket_selection_counts_its_candidates_against_the_askers_rate():
    """The same over WebSocket: get_service_info("*:calc", select:...) costs the asker one
    frame per candidate asked; past its burst the lookup is refused, saying why."""
    async with pool(max_messages_per_second=5, message_burst=40) as p:
        asker = await p.connect(client_id="asker")
        answers = await asyncio.gather(
            *(asker.get_service_info(f"{p.ws}/*:calc", {"mode": "select:max:load"}) for _ in range(12)),
            return_exceptions=True,
        )
        refused = [a for a in answers if isinstance(a, RemoteException)]
        assert refused, "12 selections of 8 candidates exceed a burst of 40"
        assert all("Rate limit exceeded" in str(r) for r in refused), refused[0]
        assert p.loads <= 40 + 5 * scaled(10), p.loads
        await asker.disconnect()


async def test_plain_http_calls_of_one_address_are_bounded_in_flight():
    """No selection: 10 concurrent anonymous calls of a function that waits: 3 run (the bound),
    7 are refused at once; another caller's call still runs."""
    async with pool(max_pending_calls=3) as p, httpx.AsyncClient(base_url=p.srv.url, timeout=30) as http:
        p.hold.clear()
        answered: list[httpx.Response] = []

        async def get() -> None:
            answered.append(await http.get(f"/{p.ws}/services/p1:calc/load"))

        calls = [asyncio.ensure_future(get()) for _ in range(10)]
        try:
            await eventually(lambda: len(answered) >= 7 and p.loading == 3, "7 refused, 3 running", timeout=10)
            for answer in answered:
                _refused_fast(answer, "Too many calls in flight")
            member = await p.clients[0].generate_token()
            other = await http.get(
                f"/{p.ws}/services/p2:calc/add?a=1&b=1", headers={"Authorization": f"Bearer {member}"}
            )
            assert other.json() == 2, other.text
        finally:
            p.hold.set()
            await asyncio.gather(*calls)
        assert sorted(a.status_code for a in answered) == [200] * 3 + [429] * 7


async def test_the_status_api_and_workspace_records_take_from_the_same_rate():
    """``GET /api/status`` reads the whole registry, ``GET /{ws}/info`` the workspace store: each
    is a call of its caller too, so a loop of them is held to the caller's rate."""
    async with (
        running(settings_for_tests(max_messages_per_second=1, message_burst=5)) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=10) as http,
    ):
        codes = [(await http.get(path)).status_code for path in ["/api/status", "/ws-x-y/info"] * 5]
        assert codes[:5] == [200, 403, 200, 403, 200], codes  # 403: no read in ws-x-y, but it was asked
        assert set(codes[5:]) == {429}, codes
        refused = await http.get("/api/status")
        _refused_fast(refused, "Rate limit exceeded: anonymous requests from 127.0.0.1")
