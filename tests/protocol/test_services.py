"""Service ids, partial-id resolution and visibility (protocol §5)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from switchboard.errors import PermissionDenied, ProtocolError
from switchboard.protocol.hypha.services import (
    ServiceQuery,
    check_use,
    full_id,
    is_presence,
    matches,
    may_list,
    may_use,
    parse_query,
    prepare_registration,
    shown,
    split_full_id,
    visibility,
)

CTX_WS = "ws-ctx"


def info(
    sid: str = "ws1/cA:svc",
    vis: str | None = None,
    app_id: str = "*",
    authorized: list[str] | None = None,
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if vis is not None:
        config["visibility"] = vis
    if authorized is not None:
        config["authorized_workspaces"] = authorized
    return {"id": sid, "app_id": app_id, "config": config}


# -- ids ---------------------------------------------------------------------


class TestFullId:
    def test_full_id(self) -> None:
        assert full_id("ws1", "cA", "svc") == "ws1/cA:svc"

    @pytest.mark.parametrize(
        ("text", "parts"),
        [
            ("ws1/cA:svc", ("ws1", "cA", "svc")),
            ("ws1/cA:svc@app", ("ws1", "cA", "svc")),
            ("ws1/cA:built-in", ("ws1", "cA", "built-in")),
            ("*/manager-X:default", ("*", "manager-X", "default")),
        ],
    )
    def test_split(self, text: str, parts: tuple[str, str, str]) -> None:
        assert split_full_id(text) == parts

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param("", id="empty"),
            pytest.param("svc", id="bare"),
            pytest.param("cA:svc", id="no-workspace"),
            pytest.param("ws1/cA", id="no-service"),
            pytest.param("/cA:svc", id="empty-workspace"),
            pytest.param("ws1/:svc", id="empty-client"),
            pytest.param("ws1/cA:", id="empty-service"),
        ],
    )
    def test_split_errors(self, text: str) -> None:
        with pytest.raises(ProtocolError, match=r"expected '<workspace>/<client>:<service>'"):
            split_full_id(text)

    def test_split_refuses_an_empty_service_before_app(self) -> None:
        with pytest.raises(ProtocolError):
            split_full_id("ws1/cA:@app")

    @pytest.mark.parametrize("text", ["ws1/a/b:svc", "ws1/c@A:svc", "ws1/cA:svc:x"])
    def test_split_refuses_grammar_violations(self, text: str) -> None:
        with pytest.raises(ProtocolError):
            split_full_id(text)


# -- partial ids (§5.2) ----------------------------------------------------------


class TestParseQuery:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("svc", ServiceQuery(CTX_WS, "*", "svc", "*")),
            ("cid:svc", ServiceQuery(CTX_WS, "cid", "svc", "*")),
            ("*:svc", ServiceQuery(CTX_WS, "*", "svc", "*")),
            ("ws/svc", ServiceQuery("ws", "*", "svc", "*")),
            ("ws/cid:svc", ServiceQuery("ws", "cid", "svc", "*")),
            ("ws/cid:svc@app", ServiceQuery("ws", "cid", "svc", "app")),
            ("ws/cid:svc@*", ServiceQuery("ws", "cid", "svc", "*")),
            ("svc@*", ServiceQuery(CTX_WS, "*", "svc", "*")),
            ("svc@app", ServiceQuery(CTX_WS, "*", "svc", "app")),
            ("built-in", ServiceQuery(CTX_WS, "*", "built-in", "*")),
            ("*/svc", ServiceQuery("*", "*", "svc", "*")),
        ],
    )
    def test_resolution_table(self, text: str, expected: ServiceQuery) -> None:
        assert parse_query(text, CTX_WS) == expected

    def test_str_is_the_full_pattern(self) -> None:
        assert str(parse_query("svc", CTX_WS)) == f"{CTX_WS}/*:svc@*"

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param("", id="empty"),
            pytest.param(None, id="none"),
            pytest.param(3, id="number"),
            pytest.param("ws/", id="no-service-after-ws"),
            pytest.param("cid:", id="no-service-after-cid"),
            pytest.param("@app", id="only-app"),
            pytest.param("/svc", id="empty-workspace"),
            pytest.param("a/b/c", id="two-slashes"),
            pytest.param("a:b:c", id="two-colons"),
        ],
    )
    def test_errors(self, text: Any) -> None:
        with pytest.raises(ProtocolError):
            parse_query(text, CTX_WS)

    def test_error_names_the_id_given(self) -> None:
        with pytest.raises(ProtocolError, match="'a/b/c'"):
            parse_query("a/b/c", CTX_WS)


class TestMatches:
    INFO = info("ws1/cA:svc", app_id="app1")

    @pytest.mark.parametrize(
        "query",
        [
            ServiceQuery("ws1"),
            ServiceQuery("*"),
            ServiceQuery("ws1", "cA"),
            ServiceQuery("ws1", "*", "svc"),
            ServiceQuery("ws1", "cA", "svc", "app1"),
            ServiceQuery("*", "*", "*", "app1"),
        ],
    )
    def test_matching(self, query: ServiceQuery) -> None:
        assert matches(self.INFO, query)

    @pytest.mark.parametrize(
        "query",
        [
            ServiceQuery("ws2"),
            ServiceQuery("ws", "cA"),
            ServiceQuery("ws1", "c"),
            ServiceQuery("ws1", "cA", "sv"),
            ServiceQuery("ws1", "cA", "svc", "app2"),
        ],
    )
    def test_not_matching(self, query: ServiceQuery) -> None:
        assert not matches(self.INFO, query)

    def test_missing_app_id_is_any_app(self) -> None:
        bare = {"id": "ws1/cA:svc"}

        assert matches(bare, ServiceQuery("ws1", app_id="*"))
        assert not matches(bare, ServiceQuery("ws1", app_id="app1"))


# -- visibility (§5.3) -------------------------------------------------------------


class TestVisibility:
    @pytest.mark.parametrize(
        ("config", "expected"),
        [
            (None, "protected"),
            ({}, "protected"),
            ({"visibility": "public"}, "public"),
            ({"visibility": "unlisted"}, "unlisted"),
            ({"visibility": "protected"}, "protected"),
            ({"visibility": "bogus"}, "protected"),
        ],
    )
    def test_effective_visibility(self, config: dict[str, Any] | None, expected: str) -> None:
        assert visibility({"id": "ws1/cA:svc", "config": config}) == expected

    # (visibility, caller ws, has_read, authorized_workspaces) -> may use by id
    @pytest.mark.parametrize(
        ("vis", "caller", "has_read", "authorized", "allowed"),
        [
            ("public", "other", False, None, True),
            ("unlisted", "other", False, None, True),
            ("protected", "other", False, None, False),
            (None, "other", False, None, False),
            ("protected", "ws1", True, None, True),
            ("protected", "other", True, None, True),
            ("protected", "other", False, ["other"], True),
            ("protected", "other", False, ["third"], False),
            ("protected", "other", False, [], False),
        ],
    )
    def test_may_use(
        self,
        vis: str | None,
        caller: str,
        has_read: bool,
        authorized: list[str] | None,
        allowed: bool,
    ) -> None:
        svc = info("ws1/cA:svc", vis=vis, authorized=authorized)

        assert may_use(svc, caller_workspace=caller, has_read=has_read) is allowed
        if allowed:
            check_use(svc, caller_workspace=caller, has_read=has_read)
        else:
            with pytest.raises(PermissionDenied, match="Permission denied for non-public service in workspace ws1"):
                check_use(svc, caller_workspace=caller, has_read=has_read)

    def test_permission_denied_is_a_permission_error(self) -> None:
        with pytest.raises(PermissionError):
            check_use(info(vis="protected"), caller_workspace="other", has_read=False)

    # (visibility, caller ws, has_read, include_unlisted, authorized) -> listed
    @pytest.mark.parametrize(
        ("vis", "caller", "has_read", "include_unlisted", "authorized", "listed"),
        [
            ("public", "other", False, False, None, True),
            ("public", "ws1", True, True, None, True),
            ("unlisted", "ws1", True, False, None, False),
            ("unlisted", "ws1", True, True, None, True),
            ("unlisted", "other", True, True, None, False),
            ("unlisted", "other", False, True, None, False),
            ("unlisted", "ws", True, True, None, False),  # "ws1/..." is not in "ws"
            ("protected", "ws1", True, False, None, True),
            ("protected", "other", True, False, None, True),
            ("protected", "other", False, False, None, False),
            ("protected", "other", False, False, ["other"], True),
            (None, "other", False, True, None, False),
        ],
    )
    def test_may_list(
        self,
        vis: str | None,
        caller: str,
        has_read: bool,
        include_unlisted: bool,
        authorized: list[str] | None,
        listed: bool,
    ) -> None:
        svc = info("ws1/cA:svc", vis=vis, authorized=authorized)

        assert may_list(svc, caller_workspace=caller, has_read=has_read, include_unlisted=include_unlisted) is listed

    @pytest.mark.parametrize("vis", ["public", "protected", "unlisted", None])
    def test_a_clients_built_in_service_is_listed_to_readers_only(self, vis: str | None) -> None:
        """It is the client's presence, which list_clients shows only with read: hypha-rpc makes it public."""
        built_in = info("ws1/cA:built-in", vis=vis, authorized=["other"])
        for caller in ("other", "ws1"):
            assert may_list(built_in, caller_workspace=caller, has_read=True, include_unlisted=True)
            assert not may_list(built_in, caller_workspace=caller, has_read=False, include_unlisted=True)


# -- registration ----------------------------------------------------------------


USER = {"id": "u1", "roles": ["user"], "email": "u1@example.org"}


def register(service: Any, *, workspace: str = "ws1", client_id: str = "cA") -> dict[str, Any]:
    return prepare_registration(service, workspace=workspace, client_id=client_id, user_wire=USER)


class TestPrepareRegistration:
    @pytest.mark.parametrize(
        "raw_id",
        ["svc", "cA:svc", "ws1/cA:svc", "ws1/cA:svc@app", "svc@app"],
    )
    def test_normalises_the_id(self, raw_id: str) -> None:
        assert register({"id": raw_id})["id"] == "ws1/cA:svc"

    def test_fills_defaults(self) -> None:
        result = register({"id": "svc"})

        assert result["config"] == {
            "visibility": "protected",
            "require_context": False,
            "flags": [],
            "singleton": False,
            "authorized_workspaces": None,
            "workspace": "ws1",
            "created_by": {"id": "u1"},
        }
        assert result["name"] == "svc"
        assert result["type"] == "generic"
        assert result["description"] is None
        assert result["docs"] is None
        assert result["app_id"] == "*"

    def test_keeps_what_the_client_sent(self) -> None:
        sent = {
            "id": "ws1/cA:hello-svc",
            "name": "Hello",
            "type": "functions",
            "description": "says hello",
            "app_id": "my-app",
            "service_schema": {"hello": {"type": "function"}},
            "config": {
                "visibility": "public",
                "require_context": True,
                "run_in_executor": True,
                "authorized_workspaces": ["ws2"],
            },
        }
        result = register(sent)

        assert result["name"] == "Hello"
        assert result["type"] == "functions"
        assert result["description"] == "says hello"
        assert result["app_id"] == "my-app"
        assert result["service_schema"] == {"hello": {"type": "function"}}
        assert result["config"]["visibility"] == "public"
        assert result["config"]["require_context"] is True
        assert result["config"]["run_in_executor"] is True
        assert result["config"]["authorized_workspaces"] == ["ws2"]

    @pytest.mark.parametrize("app_id", [None, ""])
    def test_empty_app_id_is_any_app(self, app_id: str | None) -> None:
        assert register({"id": "svc", "app_id": app_id})["app_id"] == "*"

    def test_overwrites_forged_workspace_and_creator(self) -> None:
        result = register({"id": "svc", "config": {"workspace": "evil", "created_by": {"id": "root"}}})

        assert result["config"]["workspace"] == "ws1"
        assert result["config"]["created_by"] == {"id": "u1"}

    def test_built_in_records_the_whole_user(self) -> None:
        result = register({"id": "ws1/cA:built-in", "config": {"visibility": "public"}})

        assert result["config"]["created_by"] == USER

    def test_does_not_mutate_its_argument(self) -> None:
        sent = {"id": "svc", "config": {"visibility": "public"}}
        before = copy.deepcopy(sent)

        result = register(sent)
        result["config"]["flags"].append("x")

        assert sent == before

    @pytest.mark.parametrize("vis", ["protected", "public", "unlisted"])
    def test_valid_visibility(self, vis: str) -> None:
        assert register({"id": "svc", "config": {"visibility": vis}})["config"]["visibility"] == vis

    @pytest.mark.parametrize("vis", ["secret", "", None, 1, "PUBLIC"])
    def test_rejects_invalid_visibility(self, vis: Any) -> None:
        with pytest.raises(ProtocolError, match="invalid visibility"):
            register({"id": "svc", "config": {"visibility": vis}})

    def test_rejects_another_workspace(self) -> None:
        with pytest.raises(PermissionDenied, match="service ws2/cA:svc is not in your workspace ws1"):
            register({"id": "ws2/cA:svc"})

    def test_rejects_another_client(self) -> None:
        with pytest.raises(PermissionDenied, match="belongs to another client than cA"):
            register({"id": "ws1/cB:svc"})

    def test_prefix_client_is_another_client(self) -> None:
        with pytest.raises(PermissionDenied):
            register({"id": "ws1/cA:svc"}, client_id="c")

    @pytest.mark.parametrize(
        "service",
        [
            pytest.param("svc", id="not-a-dict"),
            pytest.param(None, id="none"),
            pytest.param({}, id="no-id"),
            pytest.param({"id": ""}, id="empty-id"),
            pytest.param({"id": 5}, id="int-id"),
            pytest.param({"id": "ws1/cA"}, id="full-id-without-service"),
            pytest.param({"id": "ws1/cA:@app"}, id="empty-service-before-app"),
            pytest.param({"id": "cA:"}, id="empty-service"),
            pytest.param({"id": "svc", "config": []}, id="config-not-object"),
        ],
    )
    def test_rejects_malformed(self, service: Any) -> None:
        with pytest.raises(ProtocolError):
            register(service)


# -- presence and who else may use a service -----------------------------------


class TestPresenceAndAuthorizedWorkspaces:
    @pytest.mark.parametrize("vis", ["public", "unlisted", "protected"])
    def test_a_clients_built_in_service_is_used_only_by_readers_of_its_workspace(self, vis: str) -> None:
        presence = info("ws1/cA:built-in", vis=vis, authorized=["ws2"])
        assert may_use(presence, caller_workspace="ws1", has_read=True)
        assert not may_use(presence, caller_workspace="ws2", has_read=False), "not even an authorized workspace"
        assert not may_use(presence, caller_workspace="ws-anonymous", has_read=False)
        assert is_presence(presence)
        assert not is_presence(info("ws1/cA:built-in-ish", vis=vis))

    def test_authorized_workspaces_are_shown_only_to_readers_of_the_services_workspace(self) -> None:
        shared = info("ws1/cA:svc", vis="protected", authorized=["ws2", "ws3"])
        assert shown(shared, has_read=True) is shared
        seen = shown(shared, has_read=False)
        assert "authorized_workspaces" not in seen["config"]
        assert seen["config"]["visibility"] == "protected"
        assert shared["config"]["authorized_workspaces"] == ["ws2", "ws3"], "the stored info is not changed"
        plain_one = info("ws1/cA:svc", vis="public")
        assert shown(plain_one, has_read=False) is plain_one
