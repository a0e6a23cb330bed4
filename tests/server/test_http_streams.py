"""A generator called over plain HTTP streams its items, as Hypha's ``/{ws}/services/{svc}/{fn}``.

A real hypha-rpc client provides the generators; httpx reads the streams.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgpack
import pytest

from switchboard.hub.routing.limits import address_key
from switchboard.server.runner import RunningServer
from switchboard.testing.wait import eventually, scaled

pytestmark = pytest.mark.timeout(60)

BIG = 64 * 1024  # one item of the endless stream: a slow reader's socket fills after a few dozen
ENDLESS = 4000  # items the endless generator would give (256 MiB): far more than any buffer holds


class Generators:
    """What the provider's generators did: items given, whether each was closed."""

    def __init__(self) -> None:
        self.given = 0
        self.after_release = 0
        self.closed = asyncio.Event()
        self.release = asyncio.Event()
        self.ws = ""


@pytest.fixture
async def gens(connect: Any) -> AsyncIterator[Generators]:
    api = await connect(client_id="gen-provider")
    g = Generators()

    def count(n):  # a plain generator: hypha-rpc serves it as a remote generator, like an async one
        for i in range(int(n)):
            yield {"i": i}

    async def letters(word):
        for ch in word:
            yield ch

    async def fails_after_one():
        yield "first"
        raise ValueError("the provider gave up")

    async def endless():
        try:
            for i in range(ENDLESS):
                g.given += 1
                yield f"{i:08d}" + "x" * BIG
        finally:
            g.closed.set()

    async def waits_after_one():
        try:
            yield "first"
            await g.release.wait()  # the next item only when the test says so
            for i in range(ENDLESS):
                g.after_release += 1
                yield i
        finally:
            g.closed.set()

    await api.register_service(
        {
            "id": "gens",
            "config": {"visibility": "public"},
            "count": count,
            "letters": letters,
            "fails_after_one": fails_after_one,
            "endless": endless,
            "waits_after_one": waits_after_one,
        }
    )
    g.ws = api.config["workspace"]
    yield g
    g.release.set()


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client


def events(text: str) -> list[str]:
    """The data of each Server-Sent Event, in order; every event is one ``data:`` line."""
    assert text.endswith("\n\n"), text[-80:]
    blocks = text[:-2].split("\n\n")
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks
    return [b[len("data: ") :] for b in blocks]


async def test_a_generator_answers_an_event_stream_of_its_items_then_done(http, gens):
    response = await http.get(f"/{gens.ws}/services/gens/count", params={"n": 3})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.text == 'data: {"i": 0}\n\ndata: {"i": 1}\n\ndata: {"i": 2}\n\ndata: [DONE]\n\n'

    posted = await http.post(f"/{gens.ws}/services/gens/letters", json={"word": "abc"})
    assert [json.loads(e) for e in events(posted.text)[:-1]] == ["a", "b", "c"]
    assert events(posted.text)[-1] == "[DONE]"

    empty = await http.get(f"/{gens.ws}/services/gens/count", params={"n": 0})
    assert empty.text == "data: [DONE]\n\n"


async def test_an_error_in_the_generator_is_the_last_event_before_done(http, gens):
    response = await http.get(f"/{gens.ws}/services/gens/fails_after_one")
    assert response.status_code == 200  # the stream had begun: the error is an event of it
    first, error, done = events(response.text)
    assert json.loads(first) == "first"
    assert "the provider gave up" in json.loads(error)["error"]
    assert done == "[DONE]"


async def test_a_generator_asked_in_msgpack_streams_msgpack_objects(http, gens):
    response = await http.post(
        f"/{gens.ws}/services/gens/count",
        content=msgpack.packb({"n": 2}),
        headers={"Content-Type": "application/msgpack"},
    )
    assert response.headers["content-type"] == "application/msgpack"
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(response.content)
    assert list(unpacker) == [{"i": 0}, {"i": 1}]


async def test_a_slow_reader_holds_the_generator_back_and_its_leaving_closes_it(server, gens):
    """Back-pressure: the hub asks for the next item only once the reader has taken the last
    (up to what the sockets hold), so a reader that stops reading stops the generator; when
    it goes away the generator is closed at the provider."""
    client = httpx.AsyncClient(base_url=server.url, timeout=10)
    async with client.stream("GET", f"/{gens.ws}/services/gens/endless") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = response.aiter_raw()
        await anext(chunks)  # the stream is flowing; from here on the reader reads nothing

        previous = [-1]

        def stopped() -> bool:  # no item given between two polls
            now = gens.given
            same = now == previous[0]
            previous[0] = now
            return same

        await eventually(stopped, "the generator stopped while the reader did not read", interval=0.3)
        assert gens.given < ENDLESS / 4, f"{gens.given} items given to a reader that took one"
        assert not gens.closed.is_set()
        calls = server.app.state.switchboard.allowances.of(f"address:{address_key('127.0.0.1')}", "this test")
        assert calls.in_flight == 1, "the stream is one of its reader's calls in flight while it lasts"
    await client.aclose()  # the reader goes away mid-stream
    await asyncio.wait_for(gens.closed.wait(), scaled(10))
    assert gens.given < ENDLESS / 4


async def test_a_reader_leaving_while_the_generator_waits_closes_it_at_the_provider(server, gens):
    """The hub notices the reader left without waiting for the next item, and closes the
    generator at once; one busy giving an item (hypha-rpc cannot close it then) ends as that
    item is given, and is asked for none after it."""
    client = httpx.AsyncClient(base_url=server.url, timeout=10)
    async with client.stream("GET", f"/{gens.ws}/services/gens/waits_after_one") as response:
        first = await anext(response.aiter_raw())
        assert first == b'data: "first"\n\n'
    await client.aclose()  # gone while the provider has not yet given a second item
    # the stream holds its reader's call in flight until the hub has closed the generator
    calls = server.app.state.switchboard.allowances.of(f"address:{address_key('127.0.0.1')}", "this test")
    await eventually(lambda: calls.in_flight == 0, "the stream ended at the hub")
    gens.release.set()
    await asyncio.wait_for(gens.closed.wait(), scaled(10))
    assert gens.after_release <= 1, f"{gens.after_release} items asked of the generator after its reader left"
