"""Which fields of a workspace's services hash are one client's: an index, so that a departure
costs the client's own services, not the workspace's.

``p svc:<ws>`` holds every service of a workspace (``<cid>:<svc>`` → info), so
that a listing is one read. Finding one client's fields in it by their prefix
meant reading the whole hash: 14 ms a departure in a workspace of 10,000
clients, Redis blocked for minutes when they all left at once. Beside it,
``p svcidx:<ws>`` maps ``<cid>`` to the JSON list of that client's fields,
kept by the same scripts that write the services, so that removing a client
reads only its own. A client without an entry (registered by a version
without the index, or with no service yet) is still found by the prefix scan.
"""

from __future__ import annotations

# Lua helpers, prepended to the scripts that use them. Field names are compared as plain
# strings (no glob: ids with * or ? are safe).
INDEX_LUA = """
local function index_add(idx, cid, field)
  local raw = redis.call('HGET', idx, cid)
  local fields = {}
  if raw then fields = cjson.decode(raw) end
  for _, f in ipairs(fields) do
    if f == field then return end
  end
  table.insert(fields, field)
  redis.call('HSET', idx, cid, cjson.encode(fields))
end

local function index_remove(idx, cid, field)
  local raw = redis.call('HGET', idx, cid)
  if not raw then return end
  local kept = {}
  for _, f in ipairs(cjson.decode(raw)) do
    if f ~= field then table.insert(kept, f) end
  end
  if #kept == 0 then
    redis.call('HDEL', idx, cid)
  else
    redis.call('HSET', idx, cid, cjson.encode(kept))
  end
end

-- Removes the fields of client cid from the services hash key (its index entry names them; without
-- one, every field of the "<cid>:" prefix), appending their values to removed.
local function remove_fields(key, idx, cid, removed)
  local raw = redis.call('HGET', idx, cid)
  if raw then
    redis.call('HDEL', idx, cid)
    for _, f in ipairs(cjson.decode(raw)) do
      local value = redis.call('HGET', key, f)
      if value then
        redis.call('HDEL', key, f)
        table.insert(removed, value)
      end
    end
    return
  end
  local prefix = cid .. ':'
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then
      redis.call('HDEL', key, all[i])
      table.insert(removed, all[i + 1])
    end
  end
end
"""
