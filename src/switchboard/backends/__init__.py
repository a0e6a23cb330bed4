"""Where shared state lives: the service registry and the event bus.

Two interchangeable implementations sit behind :mod:`switchboard.backends.base`:
:mod:`~switchboard.backends.memory` (one process, the embedded default) and
Redis (any number of replicas). The hub never asks which one it has.
"""
