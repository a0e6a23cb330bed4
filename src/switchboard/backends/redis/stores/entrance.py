"""An admission's Redis work in two round trips: one pipeline of reads, then one script.

A connect asked Redis seven questions one after the other: whether its token
was revoked, whether its workspace was deleted, the workspace's record, who
holds its client id, whether the id has a registration, then it counted
itself in and claimed the id (two scripts). Each round trip costs redis-py's
client-side CPU (packing, the pool, parsing, the future, the socket's system
calls) besides its latency, and a fifth to a third of a connect's hub CPU on
Valkey went there. Here the five reads go as one pipeline (each key in its own
command: on a cluster, the revocation and workspace keys are not in the
registry's slot, and the cluster client sends each to its node), and the
count and the claim are one script (their keys all carry the registry's hash
tag: one slot). Everything is still decided before the client is admitted:
the reads before any decision, and the script decides the limits and the
holder atomically, writing nothing when it refuses.

The key names are those of :mod:`.revoked`, :mod:`.workspaces`,
:mod:`.registry` and :mod:`.counts`, spelled by their own helpers.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from redis.exceptions import RedisError

from switchboard.backends.base import Arrival, Claim, Entering, Entry
from switchboard.backends.redis.shared.batch import Batcher
from switchboard.backends.redis.stores.claim import CLAIM_LUA
from switchboard.backends.redis.stores.counts import counter_keys
from switchboard.backends.redis.stores.revoked import revoked_key
from switchboard.backends.redis.stores.transit import TransitKeys
from switchboard.backends.redis.stores.workspaces import key as workspace_key
from switchboard.errors import BackendError

# KEYS: holder hash, owner hash, the claiming replica's clients set, the guessed previous owner's
# clients set, the user's counter, the workspace's counter, the counters this replica touched.
# ARGV: "<ws>/<cid>", user id, replica id, the previous owner guessed (whose clients set KEYS[4]
# is), the per-user limit, the per-workspace limit.
# {'over', 'user'|'workspace', u, w}: a limit would be passed (nothing written);
# {'held', holder}: another user holds the id (nothing written); {'?', owner}: the guess was
# wrong (nothing written; call again with that owner); {'in', previous owner or '', u, w}.
# The limits come first, as when counting and claiming were two steps.
_ENTER = (
    CLAIM_LUA
    + """
local function total(key)
  local sum = 0
  for _, v in ipairs(redis.call('HVALS', key)) do sum = sum + tonumber(v) end
  return sum
end
local u = total(KEYS[5]) + 1
local w = total(KEYS[6]) + 1
if u > tonumber(ARGV[5]) then return {'over', 'user', u, w} end
if w > tonumber(ARGV[6]) then return {'over', 'workspace', u, w} end
local status, value = claim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if status ~= 'in' then return {status, value} end
redis.call('HINCRBY', KEYS[5], ARGV[3], 1)
redis.call('HINCRBY', KEYS[6], ARGV[3], 1)
redis.call('SADD', KEYS[7], KEYS[5], KEYS[6])
return {'in', value, u, w}
"""
)

_GUESSES = 5  # a wrong guess of the previous owner (it moved meanwhile) is rare: a few tries


class RedisEntrance:
    """:class:`~switchboard.backends.base.Entrance` on the Redis that holds the registry, the
    counts (``registry_prefix``: their keys), the revocations and the workspace records
    (``store_prefix``)."""

    def __init__(
        self,
        redis: Any,
        *,
        replica_id: str,
        registry_prefix: str = "sb:",
        store_prefix: str = "sb:",
        batch: Batcher | None = None,
    ) -> None:
        self._r = redis
        self.replica_id = replica_id
        self._keys = TransitKeys(registry_prefix)
        self._registry_prefix = registry_prefix
        self._store = store_prefix
        self._enter = redis.register_script(_ENTER)
        # connects arriving together share pipelines, for their reads and their scripts
        self._batch = batch or Batcher(redis)

    async def arrival(self, token_ids: tuple[str, ...], workspace: str, client_id: str) -> Arrival:
        wc = f"{workspace}/{client_id}"
        # one key per command: a cluster sends each to its slot's node
        reads: list[tuple[str, ...]] = [("EXISTS", revoked_key(token_id, self._store)) for token_id in token_ids]
        reads += [
            ("GET", workspace_key(self._store, "gone", workspace)),
            ("HGET", workspace_key(self._store, "wsrec"), workspace),
            ("HGET", self._keys.holder, wc),
            ("HGET", self._keys.svc(workspace), f"{client_id}:built-in"),
        ]
        try:
            replies = await self._batch.commands(reads)
        except (RedisError, OSError) as exc:
            raise BackendError(f"admission reads failed: {exc}") from exc
        revocations, (gone, record, holder, registration) = replies[: len(token_ids)], replies[len(token_ids) :]
        for reply in (*revocations, holder, registration):
            if isinstance(reply, Exception):  # fails closed: a revoked token must not pass for want of an answer
                raise BackendError(f"admission reads failed: {reply}")
        workspace_known = not isinstance(gone, Exception) and not isinstance(record, Exception)
        return Arrival(
            revoked=any(bool(n) for n in revocations),
            deleted_at=float(_text(gone)) if workspace_known and gone is not None else None,
            record=dict(json.loads(record)) if workspace_known and record is not None else None,
            holder=None if holder is None else _text(holder),
            registration=None if registration is None else json.loads(registration),
        )

    async def enter(self, entering: Entering) -> Entry:
        """See :meth:`~switchboard.backends.base.Entrance.enter`."""
        owner = entering.owner
        wc = f"{entering.workspace}/{entering.client_id}"
        previous = owner  # guessed; a wrong guess costs one more round trip (every key is in KEYS)
        users, workspaces, touched = counter_keys(self._registry_prefix, entering.principal, entering.workspace, owner)
        for _ in range(_GUESSES):
            keys = [
                self._keys.holder,
                self._keys.owner,
                self._keys.clients(owner),
                self._keys.clients(previous),
                users,
                workspaces,
                touched,
            ]
            args = [wc, entering.user, owner, previous, entering.max_per_user, entering.max_per_workspace]
            try:
                reply = await self._batch.run(self._enter, keys, args)
            except RedisError as exc:
                raise BackendError(f"admission failed: {exc}") from exc
            verdict = _text(reply[0])
            if verdict == "over":
                limit: Literal["user", "workspace"] = "user" if _text(reply[1]) == "user" else "workspace"
                return Entry(over=limit, per_user=int(reply[2]), per_workspace=int(reply[3]))
            if verdict == "held":
                return Entry(claim=Claim(holder=_text(reply[1])))
            if verdict == "in":
                claim = Claim(previous_owner=_text(reply[1]) or None)
                return Entry(claim=claim, counted=True, per_user=int(reply[2]), per_workspace=int(reply[3]))
            previous = _text(reply[1])
        raise BackendError(f"admission failed: the owner of {wc} kept changing")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
