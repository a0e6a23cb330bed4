"""Call, reply or chunk: the one classification of frames, shared by the router's bookkeeping
(:mod:`switchboard.hub.routing.router`) and the replay rule (:mod:`switchboard.hub.routing.replays`)."""

from __future__ import annotations

from typing import Any, NamedTuple

from switchboard.protocol.hypha import chunks
from switchboard.protocol.hypha.chunks import MESSAGE_CACHE, cache_op

CALL = "call"  # opens a session: a caller waits for its reply
REPLY = "reply"  # "<session>.resolve" / "<session>.reject": closes the session it answers
CHUNK = "chunk"  # a message_cache call: one piece of a message too large for one frame
OTHER = "other"  # events, callbacks, heartbeats, anything else


class Traits(NamedTuple):
    """What a frame is (see :func:`classify`)."""

    kind: str  # CALL, REPLY, CHUNK or OTHER
    answers: str | None  # the session this frame completes: a reply's, or a chunked reply's (``process``)
    op: str | None  # a chunk's message_cache operation


_CALL = Traits(CALL, None, None)
_OTHER = Traits(OTHER, None, None)


def classify(method: Any, session: str | None, rest: bytes | memoryview) -> Traits:
    """Call, reply or chunk: the one place that tells them apart.

    A call is a frame with a session to ``services.<svc>.<fn>``; chunk
    transfers (``services.built-in.message_cache.*``) are plumbing, not calls
    of their own. A reply too large for one frame travels in chunks, and its
    ``process`` names the session it answers as the chunks' key (its first
    argument), read without unpacking anything else.
    """
    if not isinstance(method, str):
        return _OTHER
    if method.startswith("services."):
        if method.startswith(MESSAGE_CACHE):
            op = cache_op(method)
            if op is not None:
                return Traits(CHUNK, chunks.chunk_key(method, rest) if op == "process" else None, op)
        elif session:
            return _CALL
    if method.endswith((".resolve", ".reject")):
        return Traits(REPLY, method.rpartition(".")[0], None)
    return _OTHER


def is_call(method: Any, session: str | None) -> bool:
    """A call that starts work (:func:`classify`'s ``CALL``)."""
    return classify(method, session, b"").kind is CALL
