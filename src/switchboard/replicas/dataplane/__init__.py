"""Frames between replicas: to one client over a direct link or the bus (:mod:`.unicast`, :mod:`.links`,
:mod:`.link`), what arrives (:mod:`.inbound`), what a lost link gives back (:mod:`.replays`), and the
other replicas as the hub reaches them (:mod:`.remote`)."""
