"""In-process backends: the embedded default, needing no external service."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from switchboard.backends.base import BusHandler, Claim, Expiry
from switchboard.clock import Clock, SystemClock
from switchboard.protocol.hypha.services import ServiceInfo, ServiceQuery, matches, split_full_id

K = TypeVar("K")


class MemoryRegistry:
    """Service infos in a dict of workspaces, so a workspace lookup is one dict access.

    Indexed by client and by service name too: what a connect, a registration or a
    departure looks up (the client's ``built-in``, a singleton's namesakes, the
    client's services) costs that client's or that name's entries, never a walk of
    the workspace, whose size would then set the cost of every connect.
    Transit deadlines are kept on ``clock`` (the hub's, so tests can use a fake one).
    """

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._by_workspace: dict[str, dict[str, ServiceInfo]] = {}
        self._by_client: dict[str, set[str]] = {}  # "<ws>/<cid>" -> ids of its services
        self._by_name: dict[tuple[str, str], set[str]] = {}  # (ws, service name) -> ids
        self._singletons: dict[str, set[str]] = {}  # ws -> ids of its singleton services
        self._clock = clock or SystemClock()
        self._transit: dict[str, tuple[float, float]] = {}  # "<ws>/<cid>" -> (left at, deadline)
        self._holders: dict[str, str] = {}  # "<ws>/<cid>" -> id of the user holding it

    async def register(self, info: ServiceInfo, *, encoded: str | None = None) -> ServiceInfo | None:
        sid = info["id"]
        ws, cid, name = split_full_id(sid)
        services = self._by_workspace.setdefault(ws, {})
        previous = services.get(sid)
        services[sid] = info
        self._by_client.setdefault(f"{ws}/{cid}", set()).add(sid)
        self._by_name.setdefault((ws, name), set()).add(sid)
        if (info.get("config") or {}).get("singleton"):
            self._singletons.setdefault(ws, set()).add(sid)
        else:
            _discard(self._singletons, ws, sid)
        return previous

    async def unregister(self, service_id: str) -> ServiceInfo | None:
        ws = service_id.partition("/")[0]
        services = self._by_workspace.get(ws)
        if services is None:
            return None
        removed = services.pop(service_id, None)
        if removed is not None:
            self._unindex(service_id)
        if not services:
            del self._by_workspace[ws]
        return removed

    def _unindex(self, service_id: str) -> None:
        ws, cid, name = split_full_id(service_id)
        _discard(self._by_client, f"{ws}/{cid}", service_id)
        _discard(self._by_name, (ws, name), service_id)
        _discard(self._singletons, ws, service_id)

    async def remove_client(self, workspace: str, client_id: str, *, owner: str | None = None) -> list[ServiceInfo]:
        """``owner`` is moot in one process: this replica owns every client."""
        client = f"{workspace}/{client_id}"
        self._transit.pop(client, None)
        self._holders.pop(client, None)
        services = self._by_workspace.get(workspace, {})
        removed = [services.pop(sid) for sid in sorted(self._by_client.get(client, ())) if sid in services]
        for info in removed:
            self._unindex(info["id"])
        if workspace in self._by_workspace and not services:
            del self._by_workspace[workspace]
        return removed

    async def holder(self, workspace: str, client_id: str) -> str | None:
        return self._holders.get(f"{workspace}/{client_id}")

    async def claim(self, workspace: str, client_id: str, *, user: str, owner: str) -> Claim:
        holder = self._holders.setdefault(f"{workspace}/{client_id}", user)
        return Claim() if holder == user else Claim(holder=holder)

    async def find(self, query: ServiceQuery) -> list[ServiceInfo]:
        if query.workspace == "*":
            pools = [info for pool in self._by_workspace.values() for info in pool.values()]
        else:
            services = self._by_workspace.get(query.workspace, {})
            if query.client_id != "*":
                ids: Iterable[str] | None = self._by_client.get(f"{query.workspace}/{query.client_id}", ())
            elif query.service_id != "*":
                ids = self._by_name.get((query.workspace, query.service_id), ())
            else:
                ids = None
            pools = list(services.values()) if ids is None else [services[sid] for sid in ids if sid in services]
        return [info for info in pools if matches(info, query)]

    async def singletons(self, workspace: str, name: str) -> list[ServiceInfo]:
        services = self._by_workspace.get(workspace, {})
        found = (services[sid] for sid in self._singletons.get(workspace, ()) if sid in services)
        return [info for info in found if matches(info, ServiceQuery(workspace, "*", name))]

    async def lost_data(self) -> bool:
        return False  # it lives and dies with this process

    async def begin_transit(self, workspace: str, client_id: str, *, owner: str, grace: float) -> bool:
        now = self._clock.monotonic()
        self._transit.setdefault(f"{workspace}/{client_id}", (now, now + grace))
        return True

    async def end_transit(self, workspace: str, client_id: str, *, owner: str) -> float | None:
        mark = self._transit.pop(f"{workspace}/{client_id}", None)
        return None if mark is None else max(0.0, self._clock.monotonic() - mark[0])

    async def expire_transit(self, workspace: str, client_id: str) -> Expiry:
        mark = self._transit.get(f"{workspace}/{client_id}")
        if mark is None:
            return Expiry("none")
        remaining = mark[1] - self._clock.monotonic()
        if remaining > 0:
            return Expiry("waiting", remaining=remaining)
        return Expiry("expired", removed=await self.remove_client(workspace, client_id))

    async def transits_due(self, limit: int = 100) -> list[str]:
        now = self._clock.monotonic()
        return sorted(
            (c for c, (_, deadline) in self._transit.items() if deadline <= now), key=lambda c: self._transit[c][1]
        )[:limit]

    async def close(self) -> None:
        self._by_workspace.clear()
        self._by_client.clear()
        self._by_name.clear()
        self._singletons.clear()
        self._transit.clear()
        self._holders.clear()

    def __repr__(self) -> str:
        count = sum(len(s) for s in self._by_workspace.values())
        return f"MemoryRegistry(workspaces={len(self._by_workspace)}, services={count})"


def _discard(table: dict[K, set[str]], key: K, service_id: str) -> None:
    ids = table.get(key)
    if ids is not None:
        ids.discard(service_id)
        if not ids:
            del table[key]


class MemoryBus:
    """Channels in a table; ``publish`` calls the listener before it returns.

    :meth:`sibling` is another replica's bus on the same table (several hubs in
    one process, in tests): a channel's messages go to the bus that subscribed
    it last.
    """

    def __init__(self, _table: dict[str, MemoryBus] | None = None) -> None:
        self._table: dict[str, MemoryBus] = {} if _table is None else _table
        self._handler: BusHandler | None = None

    def sibling(self) -> MemoryBus:
        """A bus of its own (its own listener) on this one's channels."""
        return MemoryBus(self._table)

    async def start(self) -> bool:
        return True

    @property
    def health(self) -> tuple[bool, str]:
        return True, "in-process"

    def listen(self, handler: BusHandler) -> None:
        self._handler = handler

    async def publish(self, channel: str, data: bytes) -> int:
        bus = self._table.get(channel)
        if bus is None:
            return 0
        if bus._handler is not None:
            bus._handler(channel, data)
        return 1

    async def subscribe(self, channel: str) -> None:
        self._table[channel] = self

    async def unsubscribe(self, channel: str) -> None:
        if self._table.get(channel) is self:
            del self._table[channel]

    @property
    def subscriptions(self) -> None:
        return None  # a subscription is a table entry: there is nothing to confirm

    async def close(self) -> None:
        for channel in [c for c, bus in self._table.items() if bus is self]:
            del self._table[channel]

    def __repr__(self) -> str:
        return f"MemoryBus(channels={sum(1 for bus in self._table.values() if bus is self)})"


class MemoryConnectionCounts:
    """Counters in two dicts; zero entries are dropped so they cannot pile up."""

    def __init__(self) -> None:
        self._users: dict[str, int] = {}
        self._workspaces: dict[str, int] = {}

    async def add(self, user: str, workspace: str) -> tuple[int, int]:
        self._users[user] = self._users.get(user, 0) + 1
        self._workspaces[workspace] = self._workspaces.get(workspace, 0) + 1
        return self._users[user], self._workspaces[workspace]

    async def remove(self, user: str, workspace: str) -> None:
        for table, key in ((self._users, user), (self._workspaces, workspace)):
            left = table.get(key, 0) - 1
            if left > 0:
                table[key] = left
            else:
                table.pop(key, None)
