"""Equal values kept once, and found again without a copy: a schema thousands of clients announce alike."""

from __future__ import annotations

import copy
import json

from switchboard.hub.manager.service_directory import registration_json
from switchboard.hub.manager.shared_values import SharedValues

SCHEMA = {"ping": {"type": "function", "parameters": {"msg": {"type": "string"}}}, "n": [1, 2.5, True, None]}


def test_equal_values_are_shared_and_the_table_stays_bounded() -> None:
    shared = SharedValues(limit=2)
    first = {"f": {"type": "function", "parameters": [1, 2]}}
    assert shared.share(first) is first
    assert shared.share({"f": {"parameters": [1, 2], "type": "function"}}) is first, "equal whatever the key order"
    different = {"f": {"type": "function", "parameters": [2, 1]}}
    assert shared.share(different) is different
    for alike in (
        {"f": {"type": "function", "parameters": [True, 2]}},
        {"f": {"type": "function", "parameters": [1.0, 2]}},
    ):
        assert shared.share(alike) is alike, "equal in Python, not the same JSON: kept apart"
    for i in range(10):  # a client sending a new schema every time
        shared.share({"n": i})
    assert len(shared) == 2
    odd = {"f": object()}
    assert shared.share(odd) is odd, "what is not plain data is kept as it is"


def test_a_value_built_alike_is_known_as_the_one_held() -> None:
    shared = SharedValues(limit=4)
    held = shared.share(copy.deepcopy(SCHEMA))
    assert shared.known(copy.deepcopy(SCHEMA)) is held
    assert shared.known({**SCHEMA, "n": [1, 2.5, 1, None]}) is None, "True and 1 are not built alike"
    assert shared.known({"never": "seen"}) is None
    assert shared.known({"f": object()}) is None, "what is not plain data is never known"


def test_a_value_no_longer_held_is_no_longer_known_nor_its_json_kept() -> None:
    shared = SharedValues(limit=1)
    held = shared.share(copy.deepcopy(SCHEMA))
    first = shared.json(held)
    shared.share({"another": "schema"})
    assert shared.known(copy.deepcopy(SCHEMA)) is None
    assert shared.json(held) == first
    assert shared.json(held) is not shared.json(held), "encoded each time once it is no longer held"


def test_a_held_value_is_encoded_once_as_json_dumps_writes_it() -> None:
    shared = SharedValues(limit=4)
    held = shared.share(copy.deepcopy(SCHEMA))
    text = shared.json(held)
    assert text == json.dumps(SCHEMA, separators=(",", ":"))
    assert shared.json(held) is text, "encoded again though it is held"
    stranger = copy.deepcopy(SCHEMA)
    assert shared.json(stranger) == text
    assert shared.json(stranger) is not shared.json(stranger), "a value not held is not cached (its id may be reused)"


def test_a_registration_is_encoded_as_json_dumps_writes_it_whatever_holds_its_schema() -> None:
    shared = SharedValues(limit=4)
    held = shared.share(copy.deepcopy(SCHEMA))
    infos = [
        {"id": "ws/c:built-in", "config": {"visibility": "protected"}, "service_schema": held},
        {"service_schema": held},
        {"service_schema": held, "id": "ws/c:built-in"},  # the schema not last: encoded whole
        {"id": "ws/c:echo", "service_schema": copy.deepcopy(SCHEMA)},  # a schema not held
        {"id": "ws/c:echo"},
    ]
    for info in infos:
        assert registration_json(info, shared) == json.dumps(info, separators=(",", ":"))
