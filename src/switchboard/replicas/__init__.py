"""The replica layer: everything that exists only because several replicas serve one hub.

* :mod:`~switchboard.replicas.dataplane.unicast`: frames for a client on another
  replica, over a direct link if one is known (:mod:`~switchboard.replicas.dataplane.links`, one
  connection in :mod:`~switchboard.replicas.dataplane.link` over the sans-I/O
  :mod:`switchboard.protocol.link.link_state`), else through the event bus; what
  a link gives back is published again (:mod:`~switchboard.replicas.dataplane.replays` says whether).
* :mod:`~switchboard.replicas.upkeep.cluster`: presence, the leader lease
  (:mod:`~switchboard.replicas.upkeep.lease`), the orphan reaper (:mod:`~switchboard.replicas.upkeep.reaper`) and recovery after the
  store lost its data, over the small store interfaces of :mod:`~switchboard.replicas.upkeep.stores`.

The hub calls into this layer and gets answers as values; nothing here calls
the hub back through settable hooks. The Redis-specific pieces live in
:mod:`switchboard.backends.redis` and translate Redis's errors into
:class:`~switchboard.errors.BackendError` there.
"""
