"""SubscriptionSet: desired vs confirmed bookkeeping, tested synchronously (no I/O)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from switchboard.backends.redis.bus.subscriptions import SubscriptionSet, missing

channels = st.sets(st.text(min_size=1, max_size=5), max_size=12)


def test_missing_is_desired_minus_confirmed_sorted() -> None:
    assert missing({"c", "a", "b"}, {"b"}) == ["a", "c"]
    assert missing(set(), {"x"}) == []
    assert missing({"x"}, {"x"}) == []


@given(desired=channels, confirmed=channels)
def test_missing_is_pure_and_exact(desired: set[str], confirmed: set[str]) -> None:
    before = (set(desired), set(confirmed))

    plan = missing(desired, confirmed)

    assert (desired, confirmed) == before  # no mutation
    assert plan == sorted(plan)
    assert set(plan) == desired - confirmed


def test_want_needs_wiring_until_confirmed() -> None:
    subs = SubscriptionSet()

    assert subs.want("a") is True
    assert subs.want("a") is True  # desired but not confirmed: still needs wiring
    assert subs.on_confirmed("a") is True
    assert subs.want("a") is False
    assert subs.missing() == []


def test_connection_lost_clears_confirmed_keeps_desired() -> None:
    subs = SubscriptionSet()
    for ch in ("a", "b"):
        subs.want(ch)
        subs.on_confirmed(ch)

    subs.on_connection_lost()

    assert subs.confirmed == set()
    assert subs.desired == {"a", "b"}
    assert subs.missing() == ["a", "b"]
    assert subs.want("a") is True


def test_confirmation_for_an_undesired_channel_is_ignored() -> None:
    subs = SubscriptionSet()

    assert subs.on_confirmed("late") is False
    assert subs.confirmed == set()


def test_drop_is_the_only_way_out_of_desired() -> None:
    subs = SubscriptionSet()
    subs.want("a")
    subs.on_confirmed("a")
    subs.on_unsubscribed("a")  # an ack alone does not change what is wanted
    assert subs.desired == {"a"}
    assert subs.missing() == ["a"]

    subs.drop("a")

    assert subs.desired == set()
    assert subs.missing() == []


def test_unsubscribe_then_resubscribe_replies_in_order() -> None:
    # SUBSCRIBE, UNSUBSCRIBE, SUBSCRIBE sent; Redis acks in the same order.
    subs = SubscriptionSet()
    subs.want("a")
    subs.drop("a")
    subs.want("a")

    subs.on_confirmed("a")
    subs.on_unsubscribed("a")
    subs.on_confirmed("a")

    assert subs.is_confirmed("a")


operations = st.lists(
    st.tuples(st.sampled_from(["want", "drop", "confirmed", "unsubscribed", "lost"]), st.sampled_from("abcde")),
    max_size=40,
)


@given(ops=operations)
def test_the_unconfirmed_count_is_what_is_missing_whatever_happened(ops: list[tuple[str, str]]) -> None:
    """The readiness check counts without listing (it runs before every upgrade): the count must
    stay exact through any order of subscribes, acknowledgements, drops and lost connections."""
    subs = SubscriptionSet()
    for op, channel in ops:
        {
            "want": subs.want,
            "drop": subs.drop,
            "confirmed": subs.on_confirmed,
            "unsubscribed": subs.on_unsubscribed,
            "lost": lambda _: subs.on_connection_lost(),
        }[op](channel)
        assert subs.unconfirmed() == len(subs.missing())
