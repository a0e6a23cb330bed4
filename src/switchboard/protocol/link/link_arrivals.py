"""Which frames a replica took off each link, so a frame replayed through Redis is delivered at most once.

A sender keeps each DELIVER until the receiver acks it and, should the link
die first, publishes it through Redis (``replicas/dataplane/links.py``): the frame may
have arrived and only its ack been lost. A host on the path can make that
happen at will (withhold one direction, or send one sealed frame twice so the
link is dropped), and a call delivered twice runs twice. So each DELIVER has
a number, the count of DELIVERs its direction of the link has carried (1, 2,
...: what the receiver's cumulative ack counts), and its replay carries that
number with the direction's id (``link_wire.direction_id``, known to both ends,
never sent over the link). The receiver remembers, per direction it receives:

* ``upto``: how far the link has delivered; a replay at or below it arrived
  already, unless the receiver sent it back (NACK: its client was gone), so
  the numbers it sent back are kept too;
* the numbers above ``upto`` it took from a replay first, so the link, should
  it still bring them (a host that held them back), is not obeyed either.

Whichever path brings a frame first delivers it; the other is dropped. When
the record cannot tell (a bound reached), the frame is dropped, never
delivered twice: at most once is the rule. Decisions only, without I/O: the
pool calls in with its clock's ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A replay follows its link's loss at once (as soon as the sender sees it: at most
# DEAD_AFTER, 3 s, after the receiver stopped hearing it), then one Redis hop: a
# lost link's record kept a minute covers that twenty times over.
KEEP_FOR = 60.0
# Records of lost links kept at most (the oldest go first): links are few (one per
# pair of replicas at a time), so only a link flapping for minutes comes near it.
MAX_DIRECTIONS = 1024
# Numbers one direction remembers as sent back, and as taken early from a replay. A
# NACK is rare (a client that left while frames for it were on their way) and the
# oldest ones are the likeliest acked already; a replay is at most what a lost link
# left unacked, and past this many the rest are dropped rather than risk a second copy.
MAX_SENT_BACK = 4096
MAX_EARLY = 65_536
SWEEP_EVERY = 1.0  # expired records are looked for at most this often


@dataclass(slots=True)
class _Received:
    upto: int = 0  # the highest number the link delivered (or sent back)
    sent_back: dict[int, None] = field(default_factory=dict)  # oldest first
    early: set[int] = field(default_factory=set)  # taken from a replay before the link brought them
    lost_at: float | None = None  # None while the link is open


class Arrivals:
    """Per direction received (by its id): what the link delivered and what replays did."""

    def __init__(
        self,
        *,
        keep_for: float = KEEP_FOR,
        max_directions: int = MAX_DIRECTIONS,
        max_sent_back: int = MAX_SENT_BACK,
        max_early: int = MAX_EARLY,
    ) -> None:
        self.keep_for = keep_for
        self.max_directions = max_directions
        self.max_sent_back = max_sent_back
        self.max_early = max_early
        self._of: dict[str, _Received] = {}
        self._swept_at = float("-inf")

    def __len__(self) -> int:
        return len(self._of)

    def _of_direction(self, direction: str) -> _Received:
        got = self._of.get(direction)
        if got is None:  # made only when missing: a frame's lookup allocates nothing
            got = self._of[direction] = _Received()
        return got

    def opened(self, direction: str) -> None:
        """A link opened, receiving ``direction`` (a replay of it may have come first)."""
        self._of_direction(direction).lost_at = None

    def from_link(self, direction: str, number: int) -> bool:
        """DELIVER ``number`` came over the link: deliver it (``True``), unless a replay did already."""
        got = self._of_direction(direction)
        if number > got.upto:
            got.upto = number
        if got.early and number in got.early:
            got.early.discard(number)
            return False
        return True

    def sent_back(self, direction: str, number: int) -> None:
        """DELIVER ``number`` was not delivered here (NACK): a replay of it is delivered."""
        got = self._of_direction(direction)
        got.sent_back[number] = None
        if len(got.sent_back) > self.max_sent_back:
            del got.sent_back[next(iter(got.sent_back))]

    def lost(self, direction: str, now: float) -> None:
        """The link receiving ``direction`` is gone: its record is kept :attr:`keep_for` more."""
        if (got := self._of.get(direction)) is not None:
            got.lost_at = now
        self._sweep(now)
        self._bound()

    def from_replay(self, direction: str, number: int, now: float) -> bool:
        """DELIVER ``number`` of ``direction`` came through Redis: deliver it (``True``) unless it arrived."""
        self._sweep(now)
        got = self._of.get(direction)
        if got is None:  # a link this replica never heard from: this is the frame's first arrival
            got = self._of[direction] = _Received(lost_at=now)
            self._bound()
        if number <= got.upto:
            if number in got.sent_back:  # it was not delivered here: this is its first arrival
                del got.sent_back[number]
                return True
            return False
        if number in got.early or len(got.early) >= self.max_early:
            return False
        got.early.add(number)
        return True

    def _sweep(self, now: float) -> None:
        if now - self._swept_at < SWEEP_EVERY:
            return
        self._swept_at = now
        gone = [d for d, got in self._of.items() if got.lost_at is not None and now - got.lost_at > self.keep_for]
        for direction in gone:
            del self._of[direction]

    def _bound(self) -> None:
        """At most :attr:`max_directions` records of lost links: the oldest go (open links' stay)."""
        lost = [d for d, got in self._of.items() if got.lost_at is not None]
        for direction in lost[: max(0, len(lost) - self.max_directions)]:
            del self._of[direction]
