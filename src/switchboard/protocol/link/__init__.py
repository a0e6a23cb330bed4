"""What replicas say to each other: the typed replica wire (:mod:`.replica_wire`), the relay of
manager calls, and the direct link's frames, seal, handshake gate and state (``link_*``)."""
