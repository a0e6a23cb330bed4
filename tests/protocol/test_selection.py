"""Which service a lookup returns among several (protocol/hypha/selection.py), and listing patterns."""

from __future__ import annotations

import random

import pytest

from switchboard.errors import ProtocolError
from switchboard.protocol.hypha.selection import Mode, choose, parse_mode, parse_select_timeout, to_ask
from switchboard.protocol.hypha.services import ServiceQuery, glob_match, list_query

A, B, C = "ws/a:calc", "ws/b:calc", "ws/c:calc"


def rng() -> random.Random:
    return random.Random(7)


class TestParseMode:
    @pytest.mark.parametrize(
        ("mode", "workspace", "expected"),
        [
            (None, "ws", Mode("exact")),
            (None, "public", Mode("random")),  # Hypha's default in the public workspace
            ("", "ws", Mode("exact")),
            ("first", "ws", Mode("first")),
            ("min_load", "ws", Mode("min_load")),
            ("native:random", "ws", Mode("native:random")),
            ("select:min:get_load", "ws", Mode("select", "min", "get_load")),
            ("select:first_success:ready", "ws", Mode("select", "first_success", "ready")),
        ],
    )
    def test_known_modes(self, mode: str | None, workspace: str, expected: Mode) -> None:
        assert parse_mode(mode, workspace=workspace) == expected

    @pytest.mark.parametrize(
        ("mode", "message"),
        [
            ("fastest", "Invalid mode: fastest. Mode must be 'random', 'first', 'last', 'exact', 'min_load'"),
            ("native:first", "Invalid mode: native:first"),
            (3, "Invalid mode: 3"),
            ("select:min", "Invalid select mode format: select:min. Expected 'select:criteria:function'"),
            ("select:min:a:b", "Invalid select mode format"),
            ("select:median:load", "Unknown selection criteria: median"),
            ("select:min:", "Invalid select mode function"),
            ("select:min:a.b", "Invalid select mode function"),
        ],
    )
    def test_bad_modes_are_refused_with_hyphas_messages(self, mode: object, message: str) -> None:
        with pytest.raises(ProtocolError, match=message.replace("(", r"\(").replace(".", r"\.")):
            parse_mode(mode, workspace="ws")

    @pytest.mark.parametrize("value", [0, -1, 61, "2", True, float("nan")])
    def test_select_timeout_is_bounded(self, value: object) -> None:
        with pytest.raises(ProtocolError, match="select_timeout"):
            parse_select_timeout(value)

    def test_select_timeout_defaults_to_hyphas_two_seconds(self) -> None:
        assert parse_select_timeout(None) == 2.0
        assert parse_select_timeout(0.5) == 0.5


class TestChoose:
    def test_one_candidate_is_the_answer_whatever_the_mode(self) -> None:
        for mode in (Mode("exact"), Mode("min_load"), Mode("select", "min", "f")):
            assert choose([A], mode, rng=rng()) == A

    def test_exact_refuses_several_naming_every_mode(self) -> None:
        with pytest.raises(ProtocolError, match=r"Multiple services found for q, e\.g\. .*'native:random'"):
            choose([A, B], Mode("exact"), rng=rng(), query="q")

    def test_first_and_last_follow_the_registry_order(self) -> None:
        assert choose([A, B, C], Mode("first"), rng=rng()) == A
        assert choose([A, B, C], Mode("last"), rng=rng()) == C

    def test_random_reaches_every_candidate(self) -> None:
        r = rng()
        assert {choose([A, B, C], Mode("random"), rng=r) for _ in range(60)} == {A, B, C}

    @pytest.mark.parametrize(
        ("loads", "expected"),
        [
            ({"ws/a": 3, "ws/b": 1, "ws/c": 2}, {B}),
            ({"ws/a": 3, "ws/c": 2}, {B}),  # absent = idle
            ({"ws/a": 1, "ws/b": 1, "ws/c": 4}, {A, B}),  # ties shared at random
            ({}, {A, B, C}),
        ],
    )
    def test_min_load_picks_among_the_least_loaded(self, loads: dict[str, int], expected: set[str]) -> None:
        r = rng()
        assert {choose([A, B, C], Mode("min_load"), rng=r, loads=loads) for _ in range(60)} == expected

    @pytest.mark.parametrize(
        ("local", "expected"),
        [({"ws/b"}, {B}), ({"ws/a", "ws/c"}, {A, C}), (set(), {A, B, C}), ({"ws/elsewhere"}, {A, B, C})],
    )
    def test_native_random_prefers_the_callers_replica(self, local: set[str], expected: set[str]) -> None:
        r = rng()
        assert {choose([A, B, C], Mode("native:random"), rng=r, local=local) for _ in range(60)} == expected

    @pytest.mark.parametrize(
        ("criteria", "answers", "expected"),
        [
            ("min", [(A, 5), (B, 1), (C, 9)], B),
            ("max", [(A, 5), (B, 1), (C, 9)], C),
            ("min", [(C, 1), (A, 1)], C),  # a tie goes to the first to answer
            ("min", [(A, "busy"), (B, True), (C, 4.5)], C),  # only numbers count
            ("first_success", [(C, None), (A, 1)], C),
            ("max", [("ws/other:calc", 100), (A, 1)], A),  # an answer from no candidate is ignored
        ],
    )
    def test_select_decides_on_the_answers(self, criteria: str, answers: list, expected: str) -> None:
        assert choose([A, B, C], Mode("select", criteria, "f"), rng=rng(), answers=answers) == expected

    @pytest.mark.parametrize("criteria", ["min", "max", "first_success"])
    def test_select_without_answers_falls_back_to_random(self, criteria: str) -> None:
        r = rng()
        picks = {choose([A, B, C], Mode("select", criteria, "f"), rng=r, answers=[]) for _ in range(60)}
        assert picks == {A, B, C}


def test_select_asks_every_candidate_up_to_a_bound_then_a_random_sample() -> None:
    assert to_ask([A, B, C], rng(), limit=3) == [A, B, C]
    sample = to_ask([f"ws/c{i}:calc" for i in range(100)], rng(), limit=10)
    assert len(set(sample)) == 10


class TestPatterns:
    @pytest.mark.parametrize(
        ("pattern", "value", "expected"),
        [
            ("calc*", "calc-add", True),
            ("calc*", "cal", False),
            ("*add", "calc-add", True),
            ("c*a*d", "calc-add", True),
            ("c*x*d", "calc-add", False),
            ("a*a", "a", False),  # head and tail may not overlap
            ("*", "", True),
            ("exact", "exact", True),
            ("exact", "exactly", False),
            ("*" + "a*" * 100, "a" * 99, False),  # many stars: still linear
        ],
    )
    def test_glob_match(self, pattern: str, value: str, expected: bool) -> None:
        assert glob_match(pattern, value) is expected

    def test_a_pattern_widens_the_registry_lookup_and_filters_after(self) -> None:
        listing = list_query({"service_id": "calc*", "type": "math"}, "ws")
        assert listing.lookup == ServiceQuery("ws", "*", "*")
        assert listing.patterns == {"workspace": "ws", "service_id": "calc*", "type": "math"}
        info = {"id": "ws/a:calc-add", "type": "math", "config": {}}
        assert listing.admits(info)
        assert not listing.admits({**info, "type": "text"})
        assert not listing.admits({**info, "id": "ws/a:echo"})

    def test_exact_values_keep_the_narrow_lookup(self) -> None:
        assert list_query({"client_id": "a", "service_id": "calc"}, "ws").lookup == ServiceQuery("ws", "a", "calc")

    def test_string_queries_take_patterns_too(self) -> None:
        listing = list_query("ws-*/a*:calc", "ws")
        assert listing.lookup == ServiceQuery("*", "*", "calc")
        assert listing.patterns == {"workspace": "ws-*", "client_id": "a*", "service_id": "calc"}

    @pytest.mark.parametrize(
        ("query", "message"),
        [
            ({"service_id": "calc?"}, "invalid service id 'calc\\?'"),
            ({"client_id": "a/b*"}, "invalid client id pattern"),
            ({"id": "x", "service_id": "y"}, "Cannot specify both 'id' and 'service_id'"),
            ({"service_id": "calc@app", "app_id": "other"}, "App id mismatch"),
            ({"colour": "red"}, "Unknown list_services keys: colour"),
        ],
    )
    def test_bad_patterns_are_refused(self, query: dict, message: str) -> None:
        with pytest.raises(ProtocolError, match=message):
            list_query(query, "ws")
