"""The host on a link's path (tests/support/link_mitm.py) closes in bounded time, whatever its connections do."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from support.link_mitm import LinkMitm
from switchboard.testing.wait import eventually, scaled


@pytest.fixture
def upstream_that_never_answers() -> Iterator[int]:
    """A port whose accept queue is full: a connect to it waits for an answer that never comes."""
    with socket.socket() as listener, socket.socket() as first:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        first.connect(listener.getsockname())  # takes the one place in the queue; nobody accepts
        yield listener.getsockname()[1]


async def test_a_relay_closed_while_a_connection_still_dials_the_upstream_closes_at_once(
    upstream_that_never_answers: int,
) -> None:
    """Under asyncio's debug mode on a loaded machine the relay was closed while the replica's second
    dial through it was still connecting upstream: that connection was not yet among those closed,
    and the close waited for it for good (tests/security/test_link_tampering.py, 90 s in teardown)."""
    relay = await LinkMitm(upstream_that_never_answers).__aenter__()
    _, dialler = await asyncio.open_connection("127.0.0.1", relay.port)
    try:
        await eventually(lambda: relay.connections == 1, "the relay dialling the upstream")
        await asyncio.wait_for(relay.__aexit__(None, None, None), scaled(2))
    finally:
        dialler.transport.abort()
