"""``GET /api/status``: what the web console shows, as JSON, under the same authorization as the rest.

The viewer is whoever the request's token says (``Authorization: Bearer``
or Basic, as for HTTP service calls; never a cookie), or the anonymous HTTP
user. A workspace the viewer may read (``read`` or more, or as an owner its record names) shows
its clients and every service a listing would show it (protected ones
included); any other workspace shows only its public services, and not its
clients (``list_clients`` needs ``read``). Replicas and rates are the hub's
health, which ``/metrics`` and ``/health/*`` show to anyone already.

Rates come from a :class:`StatusSampler`: every :data:`SAMPLE_INTERVAL`
seconds it reads this replica's running totals and, with several replicas,
the totals every replica writes into its presence record, and keeps the last
:data:`HISTORY` hub-wide samples, so a console that opens sees the last few
minutes at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from switchboard.errors import AuthError, BackendError, RateLimited, RequestRefused
from switchboard.hub.identity.users import Permission, user_workspace
from switchboard.protocol.hypha import services as svc_ids
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.server.http import http_services
from switchboard.server.http.http_errors import error_response
from switchboard.tasks import cancel_and_wait

if TYPE_CHECKING:
    from switchboard.hub.hub import Hub

log = logging.getLogger(__name__)

SAMPLE_INTERVAL = 2.0  # seconds between samples: the console's "every couple of seconds"
HISTORY = 90  # samples kept: three minutes


def routes() -> list[Route]:
    return [Route("/api/status", status, methods=["GET"])]


@dataclass
class _Seen:
    """One replica's totals as last read, and the rates they gave."""

    at: float
    received: float
    errors: float
    rates: dict[str, float]


class StatusSampler:
    """Hub-wide rates over the last few minutes, and the replicas' rows, refreshed in the background."""

    def __init__(self, hub: Hub, *, interval: float = SAMPLE_INTERVAL, keep: int = HISTORY) -> None:
        self.hub = hub
        self.interval = interval
        self.history: deque[dict[str, float]] = deque(maxlen=keep)
        self.replicas: list[dict[str, Any]] = []
        self._seen: dict[str, _Seen] = {}
        self._started = time.time()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"{self.hub.replica_id} status sampler")

    async def stop(self) -> None:
        """End the sampling for sure: a Redis read it is in may swallow one cancel (:mod:`switchboard.tasks`)."""
        self._stopping = True
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self.sample()
            except Exception as exc:  # a status page must never take the hub down
                log.warning("status sample failed: %s", exc, extra={"replica": self.hub.replica_id})
            await self.hub.clock.sleep(self.interval)

    async def sample(self) -> None:
        rows = await self._rows()
        total = {"messages_per_second": 0.0, "errors_per_second": 0.0, "calls_in_flight": 0.0}
        for row in rows:
            rates = self._rates(row)
            row["rates"] = rates
            for key in total:
                total[key] += rates[key]
        self._seen = {r["id"]: self._seen[r["id"]] for r in rows if r["id"] in self._seen}
        self.replicas = rows
        self.history.append({"t": round(time.time(), 3), **{k: round(v, 3) for k, v in total.items()}})

    def _rates(self, row: dict[str, Any]) -> dict[str, float]:
        """Per-second rates from the change of a replica's totals since its last reading."""
        at, received, errors = row.pop("_at"), row.pop("_received"), row.pop("_errors")
        inflight = row.pop("_inflight")
        before = self._seen.get(row["id"])
        if before is not None and at <= before.at:  # its presence was not rewritten since
            return {**before.rates, "calls_in_flight": inflight}
        rates = {"messages_per_second": 0.0, "errors_per_second": 0.0, "calls_in_flight": inflight}
        if before is not None:
            span = at - before.at
            rates["messages_per_second"] = max(0.0, received - before.received) / span
            rates["errors_per_second"] = max(0.0, errors - before.errors) / span
        self._seen[row["id"]] = _Seen(at, received, errors, rates)
        return rates

    async def _rows(self) -> list[dict[str, Any]]:
        """One row per live replica: this one from its own counters, the others from their presence."""
        hub = self.hub
        here = hub.metrics.totals()
        bus_ok, bus_why = hub.bus.health
        desired, confirmed = hub.bus.subscriptions or (None, None)
        me: dict[str, Any] = {
            "id": hub.replica_id,
            "address": hub.settings.public_base_url,
            "age_seconds": round(time.time() - self._started, 1),
            "clients": len(hub.peers),
            "leader": False,
            "subscriptions": {"confirmed": confirmed, "desired": desired},
            "bus": "ok" if bus_ok else f"down: {bus_why}",
            "self": True,
            "_at": time.monotonic(),
            "_received": here["received"],
            "_errors": here["errors"],
            "_inflight": here["inflight"],
        }
        cluster = hub.cluster
        if cluster is None:
            return [me]
        try:
            presences, leader = await cluster.presence.read_all()
        except Exception as exc:  # Redis away: show this replica alone
            log.info("status: presence not readable: %s", exc, extra={"replica": hub.replica_id})
            return [me]
        me["leader"] = leader == hub.replica_id
        me["age_seconds"] = round(time.time() - cluster.started_at, 1)
        rows = [me]
        for p in presences:
            if p.get("id") == hub.replica_id:
                continue
            rows.append(
                {
                    "id": p.get("id"),
                    "address": p.get("address"),
                    "age_seconds": round(time.time() - float(p.get("started") or time.time()), 1),
                    "clients": _number(p.get("clients")),
                    "leader": p.get("id") == leader,
                    "subscriptions": {"confirmed": _number(p.get("confirmed")), "desired": _number(p.get("desired"))},
                    "bus": p.get("bus"),
                    "self": False,
                    "_at": float(p.get("seen") or 0),
                    "_received": _number(p.get("received")) or 0.0,
                    "_errors": _number(p.get("errors")) or 0.0,
                    "_inflight": _number(p.get("inflight")) or 0.0,
                }
            )
        return sorted(rows, key=lambda r: str(r["id"]))


def _number(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _functions(schema: Any, prefix: str = "") -> list[str]:
    """Names of the callable members a service's schema lists, dotted for nested ones."""
    names: list[str] = []
    if not isinstance(schema, dict):
        return names
    for key, value in schema.items():
        if not isinstance(value, dict):
            continue
        if value.get("type") == "function":
            names.append(prefix + key)
        else:
            names.extend(_functions(value, f"{prefix}{key}."))
    return names


def _service_row(info: svc_ids.ServiceInfo) -> dict[str, Any]:
    _, client_id, service_id = svc_ids.split_full_id(info["id"])
    return {
        "id": info["id"],
        "client": client_id,
        "service": service_id,
        "name": info.get("name"),
        "description": info.get("description"),
        "type": info.get("type"),
        "visibility": svc_ids.visibility(info),
        "functions": _functions(info.get("service_schema")),
    }


async def workspaces_for(hub: Hub, request: Request) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The viewer, and the workspaces it may see with their clients and services."""
    user, own_ws = await http_services.request_user(request)
    anonymous = user is http_services.ANONYMOUS_HTTP
    with http_services.caller_allowance(request, user).holding(1):  # a scan of the registry: a call of the viewer
        found = await hub.http.find(ServiceQuery("*"))
    by_workspace: dict[str, list[svc_ids.ServiceInfo]] = {}
    for info in found:
        by_workspace.setdefault(info["id"].partition("/")[0], []).append(info)
    shown = []
    for ws in sorted(by_workspace):
        # an owner named in the workspace's record reads it, as on every other door
        readable = not anonymous and (await http_services.as_owner(request, user, ws)).can(ws, Permission.READ)
        infos = by_workspace[ws]
        # as list_services(include_unlisted=True) would show them: unlisted only in one's own workspace
        services = [
            _service_row(i)
            for i in infos
            if not i["id"].endswith(":built-in")
            and svc_ids.may_list(i, caller_workspace=own_ws, has_read=readable, include_unlisted=True)
        ]
        clients = None
        if readable:
            clients = sorted(
                (
                    {"id": i["id"].rpartition(":")[0], "user": (i.get("config") or {}).get("created_by")}
                    for i in infos
                    if i["id"].endswith(":built-in")
                ),
                key=lambda c: c["id"],
            )
        if readable or services:
            shown.append({"id": ws, "readable": readable, "clients": clients, "services": services})
    grants = [] if anonymous else sorted({*user.grants, user_workspace(user.id)})
    viewer = {"id": user.id, "anonymous": anonymous, "workspaces": grants, "roles": list(user.roles)}
    return viewer, shown


async def status(request: Request) -> Response:
    state = request.app.state.switchboard
    hub: Hub = state.hub
    sampler: StatusSampler | None = getattr(request.app.state, "status_sampler", None)
    try:
        viewer, workspaces = await workspaces_for(hub, request)
    except (AuthError, RequestRefused, BackendError, RateLimited) as exc:
        return error_response(exc)
    body = {
        "server": {
            "id": hub.settings.server_id,
            "manager_id": hub.manager_id,
            "replica": hub.replica_id,
            "public_base_url": hub.settings.public_base_url,
            "phase": state.phase.value,
        },
        "viewer": viewer,
        "replicas": sampler.replicas if sampler else [],
        "rates": {
            "interval": sampler.interval if sampler else None,
            "history": list(sampler.history) if sampler else [],
        },
        "workspaces": workspaces,
        "time": round(time.time(), 3),
    }
    return JSONResponse(body, headers={"Cache-Control": "no-store"})
