"""Where the manager refuses as Hypha refuses: the two decisions, driven directly."""

from __future__ import annotations

import re

import pytest

from switchboard.errors import PermissionDenied
from switchboard.hub.manager.manager import may_subscribe
from switchboard.protocol.hypha.services import check_include_unlisted, list_query

OWN = "ws-user-me"


@pytest.mark.parametrize("query", [None, OWN, {"workspace": OWN}, f"{OWN}/*:*", "public", {"workspace": "public"}])
def test_unlisted_services_may_be_asked_for_in_ones_own_workspace_and_public(query) -> None:
    check_include_unlisted(list_query(query, OWN), OWN)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("*", "when searching all workspaces"),
        ({"workspace": "*"}, "when searching all workspaces"),
        ("*/*:echo", "when searching all workspaces"),
        ("ws-user-you", "from workspace ws-user-you. Only services from your current workspace (ws-user-me)"),
        ({"workspace": "ws-*"}, "from workspace ws-*."),
        ("ws-user-you/c:*", "from workspace ws-user-you."),
    ],
)
def test_unlisted_services_of_another_or_every_workspace_are_refused(query, message: str) -> None:
    with pytest.raises(PermissionDenied, match=re.escape(message)):
        check_include_unlisted(list_query(query, OWN), OWN)


@pytest.mark.parametrize("name", [f"{OWN}/news", OWN, "news", "a:b", "client_disconnected", "service_added"])
def test_a_client_may_subscribe_to_its_own_workspaces_events_and_the_servers(name: str) -> None:
    assert may_subscribe(name, OWN)


@pytest.mark.parametrize("name", ["ws-user-you/news", "public/news", "ws-user-you", "ws-user-you:news", f"{OWN}x/a"])
def test_a_client_may_not_subscribe_to_another_workspaces_events(name: str) -> None:
    assert not may_subscribe(name, OWN)
