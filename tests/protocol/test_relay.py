"""Which replica a manager reply belongs to, and how the pieces of a large one are told apart."""

from __future__ import annotations

import msgpack
import pytest

from switchboard.errors import ProtocolError
from switchboard.protocol.hypha import chunks
from switchboard.protocol.link import relay

APPEND = chunks.MESSAGE_CACHE + "append"
NEAR_MISS = chunks.MESSAGE_CACHE.removesuffix(".") + "x.append"  # one letter longer than the service


def payload(key: str) -> bytes:
    return msgpack.packb({"args": [key, b"piece", False], "with_kwargs": False}, use_bin_type=True)


def test_a_piece_of_a_reply_belongs_to_the_session_it_is_keyed_by() -> None:
    assert relay.manager_session(APPEND, payload("abc.def")) == "abc"
    assert relay.manager_session("abc.resolve", b"") == "abc"
    assert relay.manager_session("services.built-in.ping", b"") is None


def test_routing_and_walking_agree_on_the_longest_key() -> None:
    """A key the walk accepts is one the relay can route, and one longer is neither."""
    longest = "k" * chunks.MAX_KEY
    assert chunks.chunk_key(APPEND, payload(longest)) == longest
    assert chunks.parse_cache_call("append", msgpack.unpackb(payload(longest))).key == longest
    too_long = longest + "k"
    assert chunks.chunk_key(APPEND, payload(too_long)) is None
    with pytest.raises(ProtocolError, match=f"key must be a string of 1 to {chunks.MAX_KEY} characters"):
        chunks.parse_cache_call("append", msgpack.unpackb(payload(too_long)))


def test_the_relay_reads_the_same_message_cache_calls_as_the_walk() -> None:
    assert chunks.cache_op(APPEND) == "append"
    assert chunks.chunk_key(NEAR_MISS, payload("abc")) is None
    assert chunks.cache_op(NEAR_MISS) is None
