"""CPython's garbage collector, tuned for a process that holds thousands of connections.

A collection holds the event loop for as long as it runs, and what it costs
grows with what it walks and, most, with the cyclic garbage it frees: a
registration through the manager's ``hypha_rpc.RPC`` (closures that refer to
themselves, a class made for each call's promises) and each HTTP request's
parser leave cycles that only a collection frees. Both are what the
generation's threshold lets accumulate.

So young collections are small and frequent, and the full one, over every
tracked object, as rare as before. With a young collection every 20,000 new
objects (this module's setting until issue 26's storms were measured), a
sibling admitting a drain's clients held its loop 12 to 17 ms of CPU per
young collection with 1,200 of them (3,000 to 5,000 objects freed each) and
15 to 57 ms with 6,000, 75 to 110 ms per middle one (up to 40,000 freed): the
longest holds of its own that its existing clients saw (the rest was waiting
for a core). Every :data:`YOUNG_EVERY` (2,000) they are at most 4 and 11 ms
with 6,000, for about the same CPU in all (bench/README.md, storm).

A full collection walks every connection's objects (about 100 each: 100 to
300 ms at 6,000 clients). CPython runs one once ten middle collections have
run since the last (and what was promoted since is a quarter of the heap);
with young collections ten times as frequent, that would be ten times as
often, several times in a storm that fills the heap, and when a crowd leaves
at once (its departures' short-lived objects promoted: 4,000 leaving cost 3.4
s of CPU with CPython's defaults, half of it full collections). Waiting for
:data:`FULL_EVERY` middle collections keeps them as far apart, in objects
allocated, as they were at 20,000 (about 2.2 million). What the process built
before serving (modules, the app: about 100,000 objects) is frozen out of
every collection, as it lives as long as the process anyway.
"""

from __future__ import annotations

import gc

# A young collection every this many new container objects (net of those freed): what it walks and
# frees, and so its pause, is bounded by that count: at most 4 ms on a loaded 2-core machine mid-storm.
YOUNG_EVERY = 2_000

# Middle collections between two full ones: 10 x as many as CPython's default, as young collections
# are 10 x as frequent as its 700 were at 20,000; so a full collection, the one pass over every
# connection's objects, comes after as many allocations as before (about 2.2 million).
FULL_EVERY = 100


def tune() -> None:
    """Set the collector up for serving; ``switchboard serve`` calls it once the app is built."""
    gc.collect()  # garbage made while starting is freed, not frozen
    gc.freeze()
    _, middle, _ = gc.get_threshold()
    gc.set_threshold(YOUNG_EVERY, middle, FULL_EVERY)
