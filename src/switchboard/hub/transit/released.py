"""Where frames go that a retry window gave up on or a finished transit hands back: the dispatch.

The retry windows and the moves are built before the dispatch, which carries
out their ``RetryLater`` and ``Hold``; what they hand back must reach the
dispatch again. That cycle closes here, in one typed place: the composition
root (:mod:`switchboard.hub.assemble`) builds this port first, hands it to them, and connects
it once to the dispatch it builds after them, as the unicast is handed its
inbound port (:mod:`switchboard.replicas.dataplane.inbound`).
"""

from __future__ import annotations

from typing import Protocol

from switchboard.hub.routing.undelivered import Undelivered


class Carrier(Protocol):
    """What carries a released frame out (:class:`~switchboard.hub.dispatch.Dispatch`)."""

    def give_up(self, target: str, item: Undelivered) -> None:
        """It cannot be delivered: its caller is told now."""
        ...

    async def deliver(self, target: str, item: Undelivered) -> None:
        """Route it again: its client is back."""
        ...


class Released:
    """The port the retry window and the moves hand frames back through, connected once."""

    __slots__ = ("_carrier",)

    def __init__(self) -> None:
        self._carrier: Carrier | None = None

    def connect(self, carrier: Carrier) -> None:
        if self._carrier is not None:
            raise RuntimeError("the released frames' port is connected already")
        self._carrier = carrier

    def give_up(self, target: str, item: Undelivered) -> None:
        self._connected().give_up(target, item)

    async def deliver(self, target: str, item: Undelivered) -> None:
        await self._connected().deliver(target, item)

    def _connected(self) -> Carrier:
        if self._carrier is None:
            raise RuntimeError("a frame was released before the dispatch was connected")
        return self._carrier
