"""Deletes a failover lost: which registry entries of this replica's clients no longer exist.

A Redis master acknowledges a write before its replica has it. When it dies
(or a replica takes over) the promoted replica may lack the last writes:
lost registrations are written back by re-assertion (:mod:`.cluster`), but
lost deletes come back too, and nothing else removes them: a service its
provider unregistered is listed again, a client that left is listed and owned
again, and since its replica is alive no reaper ever looks at it.

So after a failover each replica compares what the registry holds for the
clients it owns with what it holds itself, twice: :func:`stale_entries` takes
the registry's view (:class:`Recorded`), the replica's own (:class:`Held`) and
what the previous comparison suspected, and returns what to remove now (stale
in both comparisons, with the same stored value) and what to suspect for the
next one. The second look is what makes it safe against the replica's own
work in flight: a departure whose clean-up is still waiting on Redis, a
client whose claim is answered but not yet seen, a registration racing the
read all settle within a round, and an entry that changed in between is left
alone. The removal itself compares each value in Redis before it deletes it
(``RedisRegistry.remove_stale``). Connection counts need none of this: they
are rebuilt as absolute values (``RedisConnectionCounts.rebuild``).

I/O-free: table-tested in ``tests/replicas/test_stale.py``.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Mapping
from dataclasses import dataclass

from switchboard.backends.owned import Recorded, Stale

__all__ = ["Held", "Recorded", "Stale", "StaleVerdict", "compare", "field_of", "stale_entries"]


@dataclass(frozen=True, slots=True)
class Held:
    """What this replica holds: its live clients with the fields of their services, and the clients
    it holds for while they are away (in transit from here, or a connection being cleaned up)."""

    services: Mapping[str, Collection[str]]  # "<ws>/<cid>" -> "<cid>:<svc>" fields
    away: Container[str] = ()


@dataclass(frozen=True, slots=True)
class StaleVerdict:
    """What to remove now, and what to look at again next time."""

    remove: list[Stale]
    suspects: list[Stale]


def field_of(service_id: str) -> str:
    """The registry's field of a full service id: ``<ws>/<cid>:<svc>`` -> ``<cid>:<svc>``."""
    return service_id.partition("/")[2]


def compare(recorded: Iterable[Recorded], held: Held) -> list[Stale]:
    """Entries the registry holds for this replica's clients that the clients no longer have.

    A live client keeps what it holds and loses the rest; a client neither live
    here nor away (in transit, locally or in the registry) has left: it loses
    every entry.
    """
    found: list[Stale] = []
    for rec in recorded:
        live = held.services.get(rec.client)
        if live is not None:
            extra = {f: v for f, v in rec.services.items() if f not in live}
            if extra:
                found.append(Stale(rec.client, extra))
        elif not rec.in_transit and rec.client not in held.away:
            found.append(Stale(rec.client, dict(rec.services), departed=True))
    return found


def stale_entries(recorded: Iterable[Recorded], held: Held, suspected: Iterable[Stale] = ()) -> StaleVerdict:
    """Compare now (:func:`compare`); remove what the previous comparison (``suspected``) found
    stale too, with the same values; suspect the rest.

    A departed client is removed only if it was departed both times and its
    services are the same; a stale service only if its value is the same.
    """
    before = {s.client: s for s in suspected}
    remove: list[Stale] = []
    suspects: list[Stale] = []
    for now in compare(recorded, held):
        prior = before.get(now.client)
        if prior is None:
            suspects.append(now)
        elif now.departed:
            if prior.departed and prior.services == now.services:
                remove.append(now)
            else:
                suspects.append(now)
        else:
            confirmed = {f: v for f, v in now.services.items() if prior.services.get(f) == v}
            if confirmed:
                remove.append(Stale(now.client, confirmed))
            if len(confirmed) < len(now.services):
                suspects.append(Stale(now.client, {f: v for f, v in now.services.items() if f not in confirmed}))
    return StaleVerdict(remove, suspects)
