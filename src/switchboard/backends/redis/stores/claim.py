"""The rule for claiming a client id, in Lua: written once, run by two scripts.

A client id belongs to the user that holds it, and lives on one replica. The
registry's own claim (:mod:`.registry`, a reclaim after Redis lost its data)
and a connect's admission (:mod:`.entrance`, the claim after the connection
limits) both decide it atomically inside a script, so the rule is a Lua
function both scripts start with, not two copies that could drift apart.
"""

from __future__ import annotations

# claim(holder hash, owner hash, the claiming replica's clients set, the guessed previous owner's
# clients set, "<ws>/<cid>", user id, replica id, the previous owner guessed) returns
# 'held', holder: another user holds the id (nothing written);
# '?', owner: the guess was wrong (nothing written; call again with that owner);
# 'in', previous owner or '': the user holds the id, live on this replica.
CLAIM_LUA = """
local function claim(holder_key, owner_key, clients_key, guessed_clients_key, wc, user, replica, guess)
  local holder = redis.call('HGET', holder_key, wc)
  if holder and holder ~= user then return 'held', holder end
  local old = redis.call('HGET', owner_key, wc)
  if old and old ~= replica and old ~= guess then return '?', old end
  redis.call('HSET', holder_key, wc, user)
  if old ~= replica then
    if old then redis.call('SREM', guessed_clients_key, wc) end
    redis.call('HSET', owner_key, wc, replica)
    redis.call('SADD', clients_key, wc)
    if old then return 'in', old end
  end
  return 'in', ''
end
"""
