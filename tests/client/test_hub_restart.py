"""A hub process restarted: clients keep their identity (issue 21, item 9).

With no ``--jwt-secret`` the hub keeps the secret it made in its state
directory, so a restart on the same directory verifies the reconnection
tokens it signed before: the SDK and an unmodified hypha-rpc client come back
as themselves. When the secret did change, the SDK joins again as the same
client with the credential it was given, instead of giving up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.tokens import credential, resumption
from switchboard.client import GivingUp, Reconnected, Refused, Rejoined, connect
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

FAST = {"max_wait": 60.0, "initial_delay": 0.1, "max_delay": 1.0}  # back within a second of the hub
OLD_SECRET = "old-secret-for-restart-tests-0123456789"
NEW_SECRET = "new-secret-for-restart-tests-9876543210"


@pytest.fixture
def hubs() -> Iterator[list[ReplicaProcess]]:
    started: list[ReplicaProcess] = []
    yield started
    for hub in started:
        hub.kill()


@pytest.fixture
async def sdks() -> AsyncIterator[list[Any]]:
    made: list[Any] = []
    yield made
    for client in made:
        await asyncio.wait_for(client.disconnect(), 10)


def _public(service_id: str, **functions: Any) -> dict[str, Any]:
    return {"id": service_id, "config": {"visibility": "public"}, **functions}


async def _answers(clients: Any, url: str, service: str, *args: Any) -> Any:
    caller = await clients(url)

    async def call() -> Any:
        svc = await caller.get_service(service)
        return await svc.run(*args)

    return await eventually(call, f"{service} answers", timeout=20)


async def test_a_hub_restarted_on_its_state_dir_keeps_every_clients_identity(
    tmp_path: Path, hubs: list[ReplicaProcess], sdks: list[Any], clients: Any
) -> None:
    hub = ReplicaProcess(replica_id="keeps", jwt_secret="", state_dir=tmp_path / "state")
    hubs.append(hub.start())
    events: list[Any] = []
    sdk = await connect(hub.url, client_id="sdk-worker", on_event=events.append, **FAST)
    sdks.append(sdk)
    await sdk.register_service(_public("calc", run=lambda a, b: a + b))
    plain = await clients(hub.url, client_id="plain-worker")  # an unmodified hypha-rpc client
    await plain.register_service(_public("echo", run=lambda x: x))
    sdk_ws, plain_ws = sdk.workspace, plain.config["workspace"]

    await asyncio.to_thread(hub.restart)

    await eventually(lambda: [e for e in events if isinstance(e, Reconnected)], "the SDK back", timeout=30)
    assert not [e for e in events if isinstance(e, GivingUp | Rejoined)], events
    assert (sdk.client_id, sdk.workspace) == ("sdk-worker", sdk_ws)
    assert await _answers(clients, hub.url, f"{sdk_ws}/sdk-worker:calc", 2, 3) == 5
    assert await _answers(clients, hub.url, f"{plain_ws}/plain-worker:echo", "same") == "same"


async def test_a_hub_whose_secret_changed_gets_the_sdk_back_as_the_same_client(
    hubs: list[ReplicaProcess], sdks: list[Any], clients: Any
) -> None:
    hub = ReplicaProcess(replica_id="rotates", jwt_secret=OLD_SECRET)
    hubs.append(hub.start())
    # dave's credential is one the hub accepts after the change (made with the new secret);
    # the session he resumes was signed with the old one
    token, _ = credential("dave", 3600, secret=NEW_SECRET)
    resume = resumption("dave", "daves-worker", secret=OLD_SECRET)
    events: list[Any] = []
    sdk = await connect(
        hub.url, client_id="daves-worker", token=token, reconnection_token=resume, on_event=events.append, **FAST
    )
    sdks.append(sdk)
    assert sdk.workspace == "ws-user-dave"
    await sdk.register_service(_public("calc", run=lambda a, b: a * b))

    hub.jwt_secret = NEW_SECRET
    await asyncio.to_thread(hub.restart)

    rejoined = await eventually(
        lambda: [e for e in events if isinstance(e, Rejoined)], "the SDK joined again", timeout=30
    )
    await eventually(
        lambda: events.index(rejoined[0]) < len(events) - 1 and isinstance(events[-1], Reconnected),
        "then reconnected",
        timeout=20,
    )
    assert (rejoined[0].client_id, rejoined[0].workspace) == ("daves-worker", "ws-user-dave")
    assert "invalid token" in rejoined[0].reason
    assert not [e for e in events if isinstance(e, GivingUp)], events
    assert (sdk.client_id, sdk.workspace) == ("daves-worker", "ws-user-dave")
    assert await _answers(clients, hub.url, "ws-user-dave/daves-worker:calc", 4, 5) == 20


async def test_when_the_credential_no_longer_verifies_either_the_sdk_gives_up_saying_so(
    hubs: list[ReplicaProcess], sdks: list[Any]
) -> None:
    hub = ReplicaProcess(replica_id="revokes", jwt_secret=OLD_SECRET)
    hubs.append(hub.start())
    token, _ = credential("erin", 3600, secret=OLD_SECRET)
    events: list[Any] = []
    sdk = await connect(hub.url, client_id="erins-worker", token=token, on_event=events.append, **FAST)
    sdks.append(sdk)

    hub.jwt_secret = NEW_SECRET
    await asyncio.to_thread(hub.restart)

    gave_up = await eventually(lambda: [e for e in events if isinstance(e, GivingUp)], "the SDK gave up", timeout=30)
    assert isinstance(gave_up[0].error, Refused)
    assert "Authentication error: invalid token" in str(gave_up[0].error)
    assert len([e for e in events if isinstance(e, Rejoined)]) == 0  # tried once with the credential, then stopped
