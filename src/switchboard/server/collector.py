"""CPython's garbage collector, tuned for a process that holds thousands of connections.

By default a young collection runs every 700 container objects allocated and
not yet freed, and a full one, over every tracked object, once what survived
two young collections since the last full one reaches a quarter of the heap.
A replica with 4,000 idle clients tracks about half a million objects. When
they all left at once, each departure's futures, tasks and frames, alive for
the few milliseconds its Redis replies took, outlived two young collections
and were promoted: the departure promoted enough of them for two or three full
collections, and py-spy found the collector doing half of the replica's work
while the crowd left (4,000 leaving: 3.4 s of CPU, 1.7 s with this tuning).

So a young collection runs every :data:`YOUNG_EVERY` objects instead: what a
crowd's departures allocate mostly dies young, and what the process built
before serving (modules, the app: about 100,000 objects) is frozen out of
every collection, as it lives as long as the process anyway.
"""

from __future__ import annotations

import gc

# Young collections every this many new container objects: a crowd's in-flight departures (tens
# of objects each) are mostly freed by then, not promoted; one young collection stays a pause of
# a millisecond or two, and the cyclic garbage waiting for it a few megabytes at most.
YOUNG_EVERY = 20_000


def tune() -> None:
    """Set the collector up for serving; ``switchboard serve`` calls it once the app is built."""
    gc.collect()  # garbage made while starting is freed, not frozen
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_EVERY, older, oldest)
