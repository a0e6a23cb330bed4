"""The refusal of a subscription to another workspace's events, in Hypha's words (issue 38, item 7)."""

from __future__ import annotations

import pytest

from switchboard.hub.manager.manager import may_subscribe, subscription_refusal


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("ws-b/news", "is forbidden. Event workspace 'ws-b' does not match your workspace 'ws-a'"),
        ("ws-b", "is forbidden as it contains workspace identifiers"),
        ("ws-b:news", "is forbidden as it contains workspace identifiers"),
    ],
)
def test_the_subscription_refusal_names_the_event_and_the_rule(name: str, words: str) -> None:
    said = subscription_refusal(name, "ws-a")
    assert said is not None
    assert said.startswith(f"Subscription to event '{name}' ")
    assert words in said
    assert subscription_refusal("ws-a/news", "ws-a") is None


@pytest.mark.parametrize("name", ["ws-a/news", "ws-a", "news", "a:b", "service_added"])
def test_what_may_be_subscribed_to_has_no_refusal(name: str) -> None:
    assert subscription_refusal(name, "ws-a") is None
    assert may_subscribe(name, "ws-a")
