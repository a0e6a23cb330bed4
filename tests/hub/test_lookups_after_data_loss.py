"""Right after the shared store lost its data, a lookup waits briefly for it to be re-filled, then
says "please retry"; it never answers "not found" or an empty list. On a fake clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from support.wire import Wire
from switchboard.backends.memory import MemoryRegistry
from switchboard.errors import BackendError, NotFound
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.manager.manager_door import CALLER
from switchboard.hub.manager.service_directory import SETTLE_WAIT, ServiceDirectory
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha.services import ServiceInfo
from switchboard.testing import FakeClock
from switchboard.testing.hub import settings_for_tests

WS = "ws-team"
INFO: ServiceInfo = {"id": f"{WS}/prov:s", "name": "s", "config": {"visibility": "public"}}  # type: ignore[typeddict-item]


class RefillingRegistry(MemoryRegistry):
    """A registry that lost its data at time 0 and is re-filled (and settled) at ``refilled_at``."""

    def __init__(self, clock: FakeClock, refilled_at: float) -> None:
        super().__init__(clock=clock)
        self.fake = clock
        self.refilled_at = refilled_at

    async def find(self, query: Any) -> list[ServiceInfo]:
        if self.fake.monotonic() >= self.refilled_at and not self._refilled:
            self._refilled = True
            await self.register(INFO)
        return await super().find(query)

    _refilled = False

    async def lost_data(self) -> bool:
        return self.fake.monotonic() < self.refilled_at


@dataclass
class Host:
    registry: Any
    clock: FakeClock
    settings: Any = field(default_factory=settings_for_tests)
    registry_dirty: bool = False

    def peer_for(self, address: str) -> Peer | None:
        return None

    async def emit_event(self, workspace: str, event_type: str, data: Any) -> None:
        return None


def directory(refilled_at: float) -> tuple[ServiceDirectory, FakeClock]:
    clock = FakeClock()
    return ServiceDirectory(Host(RefillingRegistry(clock, refilled_at), clock), rpc=lambda: None), clock


@pytest.fixture(autouse=True)
def caller() -> Any:
    user = User(id="u1", grants={WS: Permission.READ_WRITE})
    peer = Peer(workspace=WS, client_id="caller", user=user, transport=Wire(), max_queue_bytes=1 << 20, replica_id="r")
    token = CALLER.set(peer)
    yield peer
    CALLER.reset(token)


async def test_a_lookup_that_finds_nothing_while_the_store_refills_waits_for_it() -> None:
    d, clock = directory(refilled_at=1.0)
    assert (await d.get_service_info(f"{WS}/prov:s"))["id"] == INFO["id"]
    assert 1.0 <= clock.monotonic() <= SETTLE_WAIT


async def test_a_lookup_says_retry_when_the_store_takes_longer_than_the_wait() -> None:
    d, clock = directory(refilled_at=SETTLE_WAIT + 5)
    with pytest.raises(BackendError, match="please retry"):
        await d.get_service_info(f"{WS}/prov:s")
    assert clock.monotonic() == pytest.approx(SETTLE_WAIT, abs=0.2)
    with pytest.raises(BackendError, match="please retry"):
        await d.list_services()


async def test_listing_waits_until_the_store_is_settled_not_merely_non_empty() -> None:
    d, clock = directory(refilled_at=1.5)
    assert [s["id"] for s in await d.list_services()] == [INFO["id"]]
    assert clock.monotonic() >= 1.5


async def test_a_settled_store_answers_not_found_at_once() -> None:
    d, clock = directory(refilled_at=0.0)
    with pytest.raises(NotFound):
        await d.get_service_info(f"{WS}/prov:nothing")
    assert clock.monotonic() == 0.0
