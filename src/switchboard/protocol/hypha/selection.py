"""Which of several matching services a lookup returns: Hypha's ``mode``, as pure functions.

``get_service`` and ``get_service_info`` (and ``?_mode=`` over HTTP) may
match several services, e.g. ``*:calc`` served by three clients. The mode
says which one the caller gets; the hub gathers what a mode needs (the
load of each provider, which providers are on the caller's replica, the
answers of a ``select:`` function) and :func:`choose` decides, without I/O.

The messages are Hypha 0.21.137's, so an application that matches on
them behaves the same.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from switchboard.errors import ProtocolError

SIMPLE_MODES = ("exact", "random", "first", "last", "min_load", "native:random")
CRITERIA = ("min", "max", "first_success")
# Hypha's default for select:...: how long the candidates' function may take
DEFAULT_SELECT_TIMEOUT = 2.0
# Candidates a select: lookup asks at most (a random sample of them beyond): one lookup
# fans out into that many calls at once, and 64 is far more than a pool of replicas of
# one service usually holds.
MAX_ASKED = 64
# A select: function is one member of the service object, named like a Python identifier.
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

_INVALID_MODE = (
    "Invalid mode: {mode}. Mode must be 'random', 'first', 'last', 'exact', 'min_load', 'native:random', "
    "or 'select:criteria:function' format (e.g., 'select:min:get_load')"
)


@dataclass(frozen=True, slots=True)
class Mode:
    """A parsed mode: ``kind`` is one of :data:`SIMPLE_MODES` or ``select``."""

    kind: str
    criteria: str = ""
    function: str = ""


def parse_mode(mode: Any, *, workspace: str) -> Mode:
    """The mode a lookup asked for, or Hypha's default: ``random`` in ``public``, else ``exact``.

    An unknown mode is refused whatever the number of matches, as Hypha does.
    """
    if mode is None or mode == "":
        return Mode("random" if workspace == "public" else "exact")
    if not isinstance(mode, str):
        raise ProtocolError(_INVALID_MODE.format(mode=repr(mode)[:100]))
    if mode in SIMPLE_MODES:
        return Mode(mode)
    if mode.startswith("select:"):
        parts = mode.split(":")
        if len(parts) != 3:
            raise ProtocolError(f"Invalid select mode format: {mode[:200]}. Expected 'select:criteria:function'")
        _, criteria, function = parts
        if criteria not in CRITERIA:
            raise ProtocolError(f"Unknown selection criteria: {criteria[:100]}")
        if not _FUNCTION.match(function):
            raise ProtocolError(
                f"Invalid select mode function: {function[:100]!r}: a member of the service, "
                "letters, digits and '_', at most 128"
            )
        return Mode("select", criteria, function)
    raise ProtocolError(_INVALID_MODE.format(mode=mode[:200]))


def parse_select_timeout(value: Any) -> float:
    """``select_timeout`` in seconds: Hypha's 2 s by default, at most 60 (a lookup is not a job)."""
    if value is None:
        return DEFAULT_SELECT_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 60:
        raise ProtocolError("select_timeout must be a number of seconds above 0 and at most 60")
    return float(value)


def to_ask(ids: Sequence[str], rng: random.Random, limit: int = MAX_ASKED) -> list[str]:
    """The candidates a ``select:`` lookup calls: all of them, or a random ``limit`` of them."""
    return list(ids) if len(ids) <= limit else rng.sample(list(ids), limit)


def client_of(service_id: str) -> str:
    """``ws/cid:svc`` → ``ws/cid``: the provider, whose load and replica count."""
    return service_id.partition(":")[0]


def choose(
    ids: Sequence[str],
    mode: Mode,
    *,
    rng: random.Random,
    query: str = "",
    loads: Mapping[str, int] | None = None,
    local: Collection[str] = (),
    answers: Sequence[tuple[str, Any]] = (),
) -> str:
    """The service id a lookup returns among the matching ``ids`` (in the registry's order).

    ``loads``: calls in flight to each provider (``ws/cid``; absent = 0), for
    ``min_load``. ``local``: providers connected to the caller's replica, for
    ``native:random``. ``answers``: ``(service id, value)`` of the candidates
    whose ``select:`` function answered in time, in the order they answered.
    Ties among the least loaded are broken at random, so idle providers share
    the work; a ``select:`` with no usable answer falls back to random, as in
    Hypha.
    """
    if not ids:
        raise ProtocolError("no candidates to choose from")
    if len(ids) == 1:
        return ids[0]
    kind = mode.kind
    if kind == "exact":
        raise ProtocolError(
            f"Multiple services found for {query}, e.g. {list(ids[:5])}. You can either specify the mode as "
            "'random', 'first', 'last', 'native:random', or use 'select:criteria:function' format."
        )
    if kind == "first":
        return ids[0]
    if kind == "last":
        return ids[-1]
    if kind == "min_load":
        counts = loads or {}
        least = min(counts.get(client_of(i), 0) for i in ids)
        return rng.choice([i for i in ids if counts.get(client_of(i), 0) == least])
    if kind == "native:random":
        near = [i for i in ids if client_of(i) in local]
        return rng.choice(near or list(ids))
    if kind == "select":
        return _selected(ids, mode.criteria, answers, rng)
    return rng.choice(list(ids))  # random


def _selected(ids: Sequence[str], criteria: str, answers: Sequence[tuple[str, Any]], rng: random.Random) -> str:
    valid = [(sid, value) for sid, value in answers if sid in ids]
    if criteria == "first_success":
        return valid[0][0] if valid else rng.choice(list(ids))
    numbers = [(sid, float(v)) for sid, v in valid if _is_number(v)]
    if not numbers:
        return rng.choice(list(ids))
    pick = min if criteria == "min" else max
    return pick(numbers, key=lambda pair: pair[1])[0]  # ties: the first to answer


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
