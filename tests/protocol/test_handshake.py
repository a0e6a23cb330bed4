"""The first frame and text control frames (protocol §2.2, §2.4, §2.5)."""

from __future__ import annotations

import json

import pytest

from switchboard.errors import HandshakeError, ProtocolError
from switchboard.protocol.hypha.handshake import (
    CLOSE_GOING_AWAY,
    CLOSE_POLICY,
    CLOSE_UNSUPPORTED,
    PONG,
    Hello,
    error_text,
    parse_control,
    parse_hello,
    reconnection_token_text,
)

DECODE_FAILED = "Failed to decode authentication information"


def hello(**fields: object) -> str:
    """A first frame as the client sends it: all four keys, overridden by ``fields``."""
    frame: dict[str, object] = {
        "client_id": "cA",
        "workspace": None,
        "token": None,
        "reconnection_token": None,
    }
    frame.update(fields)
    return json.dumps(frame)


def refusal(text: str | bytes) -> HandshakeError:
    with pytest.raises(HandshakeError) as info:
        parse_hello(text)
    return info.value


def test_close_codes_match_the_reference() -> None:
    assert (CLOSE_POLICY, CLOSE_UNSUPPORTED, CLOSE_GOING_AWAY) == (1008, 1003, 1001)


def test_handshake_error_is_a_protocol_error() -> None:
    assert isinstance(refusal("nope"), ProtocolError)


class TestParseHelloAccepts:
    def test_the_four_key_frame(self) -> None:
        assert parse_hello(hello()) == Hello(client_id="cA", workspace=None, token=None, reconnection_token=None)

    def test_bytes(self) -> None:
        assert parse_hello(hello().encode()) == parse_hello(hello())

    def test_all_fields_set(self) -> None:
        parsed = parse_hello(hello(workspace="ws-1", token="tok", reconnection_token="rtok"))

        assert parsed == Hello(client_id="cA", workspace="ws-1", token="tok", reconnection_token="rtok")

    def test_empty_strings_mean_absent(self) -> None:
        parsed = parse_hello(hello(workspace="", token="", reconnection_token=""))

        assert (parsed.workspace, parsed.token, parsed.reconnection_token) == (None, None, None)

    def test_missing_optional_keys(self) -> None:
        assert parse_hello('{"client_id": "cA"}') == Hello("cA", None, None, None)

    def test_unknown_keys_are_ignored(self) -> None:
        assert parse_hello(hello(extra=1)).client_id == "cA"

    @pytest.mark.parametrize(
        "client_id",
        ["a", "Z9", "a_b-c|d.e", "x" * 128, "7VbGmWqTfTbXKcYJxEWL3V"],
    )
    def test_valid_client_ids(self, client_id: str) -> None:
        assert parse_hello(hello(client_id=client_id)).client_id == client_id

    @pytest.mark.parametrize("workspace", ["public", "ws-user-anonymouz-x", "my_ws.v2", "w" * 128])
    def test_valid_workspaces(self, workspace: str) -> None:
        assert parse_hello(hello(workspace=workspace)).workspace == workspace


class TestParseHelloRefuses:
    @pytest.mark.parametrize(
        "text",
        [
            pytest.param("", id="empty"),
            pytest.param("not json", id="text"),
            pytest.param('{"client_id": "cA"', id="truncated"),
            pytest.param(b"\xff\xfe\x00", id="not-utf8"),
        ],
    )
    def test_non_json(self, text: str | bytes) -> None:
        error = refusal(text)

        assert str(error) == DECODE_FAILED
        assert error.close_code == 1003

    @pytest.mark.parametrize("text", ["[]", '"cA"', "42", "null", "true"])
    def test_not_an_object(self, text: str) -> None:
        error = refusal(text)

        assert str(error) == f"{DECODE_FAILED}: expected a JSON object"
        assert error.close_code == 1003

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param('{"workspace": null}', id="missing"),
            pytest.param(hello(client_id=""), id="empty"),
            pytest.param(hello(client_id=None), id="null"),
            pytest.param(hello(client_id=7), id="number"),
        ],
    )
    def test_missing_client_id(self, text: str) -> None:
        error = refusal(text)

        assert str(error) == "Failed to establish connection: client_id is missing"
        assert error.close_code == 1001

    @pytest.mark.parametrize(
        "client_id",
        [
            pytest.param("ws1/cA", id="slash"),
            pytest.param("ws1:cA", id="colon"),
            pytest.param("x" * 129, id="too-long"),
            pytest.param("c A", id="space"),
            pytest.param("c@A", id="at"),
            pytest.param("*", id="star"),
        ],
    )
    def test_invalid_client_id(self, client_id: str) -> None:
        error = refusal(hello(client_id=client_id))

        assert str(error).startswith("Failed to establish connection: invalid client_id ")
        assert repr(client_id[:64]) in str(error)
        assert error.close_code == 1001

    @pytest.mark.parametrize("key", ["token", "reconnection_token", "workspace"])
    @pytest.mark.parametrize("value", [1, ["t"], {"t": 1}, True])
    def test_non_string_optional_field(self, key: str, value: object) -> None:
        error = refusal(hello(**{key: value}))

        assert str(error) == f"{DECODE_FAILED}: {key!r} must be a string"
        assert error.close_code == 1008

    @pytest.mark.parametrize(
        "workspace",
        [
            pytest.param("a/b", id="slash"),
            pytest.param("a:b", id="colon"),
            pytest.param("w" * 129, id="too-long"),
            pytest.param("my ws", id="space"),
            pytest.param("*", id="star"),
        ],
    )
    def test_bad_workspace_name(self, workspace: str) -> None:
        error = refusal(hello(workspace=workspace))

        assert str(error) == (f"Failed to establish connection: invalid workspace name {workspace[:64]!r}")
        assert error.close_code == 1001

    def test_client_id_with_trailing_newline(self) -> None:
        assert refusal(hello(client_id="cA\n")).close_code == 1001

    def test_workspace_with_trailing_newline(self) -> None:
        assert refusal(hello(workspace="ws1\n")).close_code == 1001


class TestControlFrames:
    @pytest.mark.parametrize("kind", ["ping", "refresh_token"])
    def test_recognised(self, kind: str) -> None:
        assert parse_control(json.dumps({"type": kind})) == kind

    def test_extra_keys_are_fine(self) -> None:
        assert parse_control('{"type": "ping", "t": 1}') == "ping"

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param('{"type": "pong"}', id="pong"),
            pytest.param('{"type": "hello"}', id="unknown-type"),
            pytest.param('{"type": ["ping"]}', id="list-type"),
            pytest.param("{}", id="no-type"),
            pytest.param('["ping"]', id="array"),
            pytest.param('"ping"', id="string"),
            pytest.param("ping", id="not-json"),
            pytest.param("", id="empty"),
        ],
    )
    def test_others_are_ignored(self, text: str) -> None:
        assert parse_control(text) is None

    def test_longest_accepted_frame(self) -> None:
        text = json.dumps({"type": "ping", "pad": ""})
        text = text[:-2] + " " * (1000 - len(text)) + text[-2:]

        assert len(text) == 1000
        assert parse_control(text) == "ping"

    def test_frames_over_1000_chars_are_ignored(self) -> None:
        text = json.dumps({"type": "ping", "pad": "x" * 1000})

        assert len(text) > 1000
        assert parse_control(text) is None


class TestServerTextFrames:
    def test_error(self) -> None:
        assert json.loads(error_text("Server busy, please retry")) == {
            "type": "error",
            "message": "Server busy, please retry",
        }

    def test_pong(self) -> None:
        assert json.loads(PONG) == {"type": "pong"}

    def test_reconnection_token(self) -> None:
        assert json.loads(reconnection_token_text("abc")) == {
            "type": "reconnection_token",
            "reconnection_token": "abc",
        }
