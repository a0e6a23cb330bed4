"""The rules of what passes between an HTTP request and an app a client serves (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.errors import FrameTooLarge, ProtocolError
from switchboard.protocol.link.relay import manager_in_workspace
from switchboard.server.http import app_exchange as rules

UVICORN_SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.3"},
    "http_version": "1.1",
    "server": ("127.0.0.1", 9527),
    "client": ("127.0.0.1", 50000),
    "scheme": "http",
    "method": "POST",
    "root_path": "",
    "path": "/ws-a/apps/site/api/v1",
    "raw_path": b"/ws-a/apps/site/api/v1",
    "query_string": b"x=1",
    "headers": [(b"authorization", b"Bearer t"), (b"cookie", b"sb_rpc_0123456789abcdef=secret; theme=dark")],
    "app": object(),  # what the server adds that is not plain data never leaves
    "state": {},
}


def test_the_apps_scope_is_the_requests_below_the_service_id_with_the_token_and_without_hub_cookies():
    scope = rules.app_scope(UVICORN_SCOPE, workspace="ws-a", service_id="site", path="api/v1")
    assert (scope["path"], scope["raw_path"]) == ("/api/v1", b"/api/v1")
    assert (scope["workspace"], scope["service_id"], scope["method"]) == ("ws-a", "site", "POST")
    assert scope["headers"] == [[b"authorization", b"Bearer t"], [b"cookie", b"theme=dark"]]
    assert scope["client"] == ["127.0.0.1", 50000]
    assert "app" not in scope
    assert "state" not in scope
    only_hub = dict(UVICORN_SCOPE, headers=[(b"cookie", b"sb_rpc_0123456789abcdef=secret")])
    assert rules.app_scope(only_hub, workspace="ws-a", service_id="site", path="")["headers"] == []


def test_a_declared_body_above_the_bound_is_refused_before_any_app_runs():
    assert rules.request_has_body([(b"content-length", b"10")], 10)
    assert not rules.request_has_body([(b"content-length", b"0")], 10)
    assert rules.request_has_body([(b"transfer-encoding", b"chunked")], 10)
    with pytest.raises(FrameTooLarge, match="11 bytes is above the limit of 10"):
        rules.request_has_body([(b"content-length", b"11")], 10)


def test_the_request_body_is_counted_as_the_app_reads_it():
    body = rules.RequestBody(10)
    assert body.take({"type": "http.request", "body": b"12345", "more_body": True})["more_body"] is True
    with pytest.raises(FrameTooLarge):
        body.take({"type": "http.request", "body": b"123456", "more_body": False})


def test_a_response_is_one_start_then_body_pieces_within_the_bound():
    guard = rules.ResponseGuard(8)
    with pytest.raises(ProtocolError, match="before http.response.start"):
        guard.accept({"type": "http.response.body", "body": b"x"})
    start = guard.accept({"type": "http.response.start", "status": 200, "headers": [["Content-Type", "text/plain"]]})
    assert start["headers"] == [(b"content-type", b"text/plain")]
    with pytest.raises(ProtocolError, match="twice"):
        guard.accept({"type": "http.response.start", "status": 200})
    assert guard.accept({"type": "http.response.body", "body": b"1234", "more_body": True})["body"] == b"1234"
    with pytest.raises(FrameTooLarge):
        guard.accept({"type": "http.response.body", "body": b"12345", "more_body": True})


@pytest.mark.parametrize(
    "message",
    [
        {"type": "http.response.start", "status": 99},
        {"type": "http.response.start", "status": True},
        {"type": "http.response.start", "status": 200, "headers": [[b"x-a", b"1\r\nset-cookie: a=b"]]},
        {"type": "http.response.start", "status": 200, "headers": [[b"bad name", b"1"]]},
        {"type": "http.response.start", "status": 200, "headers": [[b"set-cookie", b"sb_rpc_0123=forged; Path=/"]]},
        {"type": "websocket.send"},
        ["not", "a", "message"],
    ],
)
def test_what_an_app_may_not_send_is_refused(message):
    with pytest.raises(ProtocolError):
        rules.ResponseGuard(100).accept(message)


def test_a_function_is_found_by_path_then_index_then_default():
    def f(event):
        return event

    index, nested, default = (lambda e: 1), (lambda e: 2), (lambda e: 3)
    service = {"id": "x", "config": {}, "index": index, "api": {"v1": {"users": nested}, "docs": {"index": f}}}
    assert rules.find_function(service, "/") == (index, None)
    assert rules.find_function(service, "/api/v1/users/") == (nested, None)
    assert rules.find_function(service, "/api/docs") == (f, None)
    assert rules.find_function(service, "/config") == (None, None)  # not a function
    assert rules.find_function({**service, "default": default}, "/some/where") == (default, "/some/where")
    assert rules.find_function({"default": default}, "") == (default, "/")


def test_a_functions_answer_becomes_status_headers_and_body():
    assert rules.function_reply({"body": "hi"}, 10) == (200, [], b"hi")
    assert rules.function_reply({"status": 201, "headers": {"X-A": "1"}, "body": b"\x00"}, 10) == (
        201,
        [(b"x-a", b"1")],
        b"\x00",
    )
    for bad in ("text", {"status": "200"}, {"body": {"a": 1}}):
        with pytest.raises(ProtocolError):
            rules.function_reply(bad, 10)
    with pytest.raises(FrameTooLarge):
        rules.function_reply({"body": "x" * 11}, 10)


def test_a_missing_service_is_told_apart_from_an_unknown_workspace_in_hyphas_words():
    detail = "Service not found: ws-a/*:site@*"
    assert rules.missing("ws-a", recorded=False, populated=True, detail=detail) == detail
    assert rules.missing("public", recorded=False, populated=False, detail=detail) == detail
    assert rules.missing("ws-b", recorded=False, populated=False, detail=detail) == (
        "Workspace ws-b does not exist or is not accessible"
    )


def test_only_session_callbacks_to_a_workspaces_manager_are_answered_from_that_address():
    assert manager_in_workspace("ws-a/manager-x", "abc.def#send", "manager-x") == "ws-a"
    assert manager_in_workspace("*/manager-x", "abc.def#send", "manager-x") is None
    assert manager_in_workspace("ws-a/manager-x", "services.default.echo", "manager-x") is None
    assert manager_in_workspace("ws-a/other", "abc.def#send", "manager-x") is None
