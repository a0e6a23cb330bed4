"""Equal values kept once: what thousands of clients each announce alike costs one copy.

Every hypha-rpc client registers a ``built-in`` service whose ``service_schema``
(about 2 KiB of JSON, 7 KiB as Python objects) is the same for every client
of one hypha-rpc version. A replica keeps each client's registrations for as
long as it is connected (to re-assert them if Redis loses its data), so ten
thousand idle clients held ten thousand copies of one schema. Registered
values are never changed in place, so equal ones can be one object.
"""

from __future__ import annotations

import json
import marshal
from collections import OrderedDict
from typing import Any

# marshal's format 2: exact types (True, 1 and 1.0 apart) and no back-references, so that two
# values built alike encode alike whatever else refers to their parts
_EXACT = 2


class SharedValues:
    """The last ``limit`` distinct values seen, by their canonical JSON; :meth:`share` swaps a value
    for an equal one seen before. Bounded: a client sending a new schema each time evicts, never grows.

    The canonical JSON (keys sorted) costs about 30 µs for a schema, on every
    connect; the value's marshal encoding (5 µs) finds it again for a value
    built alike (the same keys in the same order), which is what one client
    version sends every time.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: OrderedDict[str, Any] = OrderedDict()
        self._canonical: OrderedDict[bytes, str] = OrderedDict()  # marshal encoding -> canonical JSON
        # id of each value held -> the value (its id is not reused while it is held) and its compact JSON
        self._json: dict[int, tuple[Any, str]] = {}

    def known(self, value: Any) -> Any | None:
        """The value held that ``value`` was built alike to (the same marshal encoding), else ``None``:
        found without copying or encoding ``value``, which can then be dropped unread."""
        try:
            key = self._canonical.get(marshal.dumps(value, _EXACT))
        except ValueError:
            return None
        if key is None or (held := self._seen.get(key)) is None:
            return None
        self._seen.move_to_end(key)
        return held

    def json(self, held: Any) -> str:
        """``held``'s compact JSON, encoded once when it was first shared (``held``: a value
        :meth:`share` or :meth:`known` returned; anything else is encoded each time)."""
        entry = self._json.get(id(held))
        if entry is not None and entry[0] is held:
            return entry[1]
        return json.dumps(held, separators=(",", ":"))

    def share(self, value: Any) -> Any:
        """An object equal to ``value`` (the first one seen, if any), to keep instead of it."""
        try:
            exact = marshal.dumps(value, _EXACT)
        except ValueError:
            return value  # not plain data: kept as it is
        key = self._canonical.get(exact)
        if key is None:
            try:
                key = json.dumps(value, sort_keys=True, separators=(",", ":"))
            except (TypeError, ValueError):
                return value  # not plain data: kept as it is
            self._canonical[exact] = key
            if len(self._canonical) > self._limit:
                self._canonical.popitem(last=False)
        else:
            self._canonical.move_to_end(exact)
        seen = self._seen.get(key)
        if seen is not None:
            self._seen.move_to_end(key)
            return seen
        self._seen[key] = value
        self._json[id(value)] = (value, json.dumps(value, separators=(",", ":")))
        if len(self._seen) > self._limit:
            _, evicted = self._seen.popitem(last=False)
            del self._json[id(evicted)]
        return value

    def __len__(self) -> int:
        return len(self._seen)
