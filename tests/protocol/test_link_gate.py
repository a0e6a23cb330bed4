"""Who may start a link handshake, and how refusals are logged: decisions on an explicit clock (no I/O)."""

from __future__ import annotations

from switchboard.protocol.link.link_gate import (
    DESCRIPTOR_RESERVE,
    MAX_PENDING_PER_ADDRESS,
    REFUSAL_LOG_INTERVAL,
    HandshakeGate,
    RefusalLog,
)


def test_one_address_holds_at_most_its_share_of_unfinished_handshakes() -> None:
    gate = HandshakeGate()
    assert all(gate.admit("10.0.0.9") for _ in range(MAX_PENDING_PER_ADDRESS))
    assert not gate.admit("10.0.0.9")  # turned away, unanswered
    assert gate.admit("10.0.0.7")  # another address is not held up by it
    assert gate.pending == MAX_PENDING_PER_ADDRESS + 1

    gate.release("10.0.0.9")  # one finished (proven, refused, or gone)
    assert gate.admit("10.0.0.9")
    assert not gate.admit("10.0.0.9")


def test_released_handshakes_leave_nothing_behind() -> None:
    gate = HandshakeGate(per_address=2)
    for address in ("a", "a", "b"):
        assert gate.admit(address)
    for address in ("a", "a", "b"):
        gate.release(address)
    assert gate.pending == 0
    assert gate.pending_from("a") == 0
    assert gate._pending == {}  # no entry kept per address once its handshakes are over


def test_the_first_refusal_is_logged_at_once_and_the_rest_as_one_count_per_interval() -> None:
    log = RefusalLog(interval=10.0)
    assert log.refused(0.0, "from 10.0.0.9: no handshake within 3 s") == (
        "link handshake refused from 10.0.0.9: no handshake within 3 s"
    )
    lines = [log.refused(0.02 * i, f"from 10.0.0.9: refusal {i}") for i in range(1, 400)]
    assert lines == [None] * 399
    assert log.due(9.9) is None
    assert log.due(10.0) == ("399 link handshakes refused in the last 10 s; the last from 10.0.0.9: refusal 399")
    assert log.due(30.0) is None  # nothing since


def test_a_refusal_after_a_quiet_interval_is_logged_at_once_again() -> None:
    log = RefusalLog()
    assert log.refused(0.0, "from a: x") is not None
    assert log.refused(REFUSAL_LOG_INTERVAL, "from b: y") == "link handshake refused from b: y"


def test_all_addresses_together_hold_at_most_the_total() -> None:
    gate = HandshakeGate(per_address=16, total=64)
    taken = [gate.admit(f"127.0.0.{i}") for i in range(2, 72) for _ in range(16)]  # 70 addresses, 1,120 handshakes
    assert sum(taken) == 64
    assert gate.refusal("127.0.0.200") == "64 unfinished handshakes already (--max-link-handshakes)"
    gate.release("127.0.0.2")
    assert gate.admit("127.0.0.200")
    assert gate.pending == 64


def test_no_handshake_is_taken_from_the_descriptors_kept_for_clients() -> None:
    gate = HandshakeGate(reserve=DESCRIPTOR_RESERVE)
    limit = 1024
    assert gate.refusal("10.0.0.9", (limit - DESCRIPTOR_RESERVE - 1, limit)) is None
    refusal = gate.refusal("10.0.0.9", (limit - DESCRIPTOR_RESERVE, limit))
    assert refusal == f"768 of 1024 file descriptors open, the last {DESCRIPTOR_RESERVE} kept for clients"
    assert gate.pending == 1, "a refused connection is not counted"


def test_releasing_what_was_never_taken_counts_nothing() -> None:
    gate = HandshakeGate()
    gate.release("10.0.0.9")
    assert gate.pending == 0
    assert gate.admit("10.0.0.9")
    assert gate.pending == 1
