"""Which WebSocket upgrades a replica turns away before accepting them (``ServerState.refusal``)."""

from __future__ import annotations

from dataclasses import dataclass

from switchboard.server.process.server_state import Phase, ServerState


@dataclass
class Bus:
    health: tuple[bool, str] = (True, "ok")


@dataclass
class HubWithBus:
    bus: Bus


def state(phase: Phase, health: tuple[bool, str] = (True, "ok")) -> ServerState:
    s = ServerState(HubWithBus(Bus(health)))  # type: ignore[arg-type]
    s.phase = phase
    return s


def test_a_ready_replica_with_a_healthy_backend_welcomes_clients() -> None:
    assert state(Phase.READY).refusal() is None


def test_a_replica_cut_off_from_its_backend_turns_upgrades_away_with_a_retryable_reason() -> None:
    why = state(Phase.READY, (False, "pub/sub connection lost")).refusal()
    assert why == "Hub backend unavailable, please retry"


def test_starting_and_draining_come_first() -> None:
    for phase in (Phase.STARTING, Phase.DRAINING, Phase.STOPPED):
        assert state(phase, (False, "down")).refusal() == "Server is draining or starting, please retry"
