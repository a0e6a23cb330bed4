"""The replica layer: everything that exists only because several replicas serve one hub.

* :mod:`~switchboard.replicas.dataplane.unicast`: frames for a client on another
  replica, over a direct link if one is known (:mod:`.links`, one
  connection in :mod:`.link` over the sans-I/O
  :mod:`switchboard.protocol.link.link_state`), else through the event bus; what
  a link gives back is published again (the hub's :mod:`switchboard.hub.routing.replays` says whether).
* :mod:`~switchboard.replicas.upkeep.cluster`: presence, the leader lease
  (:mod:`.lease`), the orphan reaper (:mod:`.reaper`) and recovery after the
  store lost its data, over the small store interfaces of :mod:`.stores`.

The hub calls into this layer and gets answers as values; nothing here calls
the hub back through settable hooks. The Redis-specific pieces live in
:mod:`switchboard.backends.redis` and translate Redis's errors into
:class:`~switchboard.errors.BackendError` there.
"""
