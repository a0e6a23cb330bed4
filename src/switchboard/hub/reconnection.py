"""A connection's reconnection token, signed afresh at most once a minute."""

from __future__ import annotations

from switchboard.clock import Clock
from switchboard.hub.gate.admission import Gatekeeper
from switchboard.hub.sessions.peer import Peer

# Seconds a connection's last reconnection token is handed out again instead of a
# new one (at most a tenth of the token's lifetime, so a reused token has nearly all
# of it left): hypha-rpc asks 2 s after connecting, then every 2 hours by default.
TOKEN_REUSE = 60.0


class ReconnectionTokens:
    """Signs the token that resumes a peer's identity (:meth:`Gatekeeper.reconnection_token`), at most
    every :data:`TOKEN_REUSE` seconds per connection: a ``refresh_token`` flood gets the last one
    again, costing no signature each. Each connection's last token is kept here until the hub
    detaches it (:meth:`forget`)."""

    def __init__(self, gate: Gatekeeper, *, clock: Clock, lifetime: float) -> None:
        self._gate = gate
        self._clock = clock
        self._reuse = min(TOKEN_REUSE, lifetime / 10)
        self._signed: dict[Peer, tuple[str, float]] = {}  # each live connection's last token, and when (monotonic)

    def __call__(self, peer: Peer) -> str:
        now = self._clock.monotonic()
        last = self._signed.get(peer)
        if last is not None and now - last[1] < self._reuse:
            return last[0]
        token = self._gate.reconnection_token(peer)
        if not peer.closed:  # a closed one is being detached: nothing kept past its forget
            self._signed[peer] = (token, now)
        return token

    def forget(self, peer: Peer) -> None:
        """``peer`` was detached: its token is no longer handed out again."""
        self._signed.pop(peer, None)

    def __len__(self) -> int:
        return len(self._signed)
