-- netlimit sliding window log; mirrors algorithms.sliding_window_log.
-- KEYS[1] sorted set of admitted timestamps: one member per unit of cost,
--         scored by its timestamp and named '<timestamp>:<n>' so it is unique
-- Returns {allowed, limit, remaining, retry_after, reset, delay}; floats as
-- '%.17g' strings because Redis truncates Lua numbers to integers; an admission
-- answers admit() (_prelude.lua).  cap = lim; ttl is the key's TTL in ms,
-- ceil(period * 1000) + 1000, as text (store.limit_lua).
-- (stores/redis.py limit_lua and _prelude.lua define lim, period, cap, ttl, fmt, admit,
-- now, nowstr, key, cost, dry)
-- Earlier versions numbered the members from a second key '<KEYS[1]>:seq'
-- (INCRBY); one left behind by an upgrade is never touched again and expires by
-- its TTL.  Their members (bare numbers) cannot collide with '<timestamp>:<n>'.
-- An admission runs TIME, ZREMRANGEBYSCORE, ZCARD, ZCOUNT (if the log is not
-- empty), ZADD and PEXPIRE.
-- A number passed to redis.call is formatted by Redis with '%.17g' (exact, read
-- back to the same double); integers go as '%d' strings, which costs less.

-- entries stamped t expire when t <= now - period (window is (now - period, now]);
-- a dry run leaves them (it never writes: a later call whose now steps back
-- before this cutoff must still count them) and skips them by rank instead
-- (a number: Redis's own '%.17g' costs less than fmt() in Lua)
local cutoff = now - period
local count, off = 0, 0
if dry then
  off = redis.call('ZCOUNT', key, '-inf', cutoff)
  count = redis.call('ZCARD', key) - off
else
  redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
  count = redis.call('ZCARD', key)
end
local function newest() -- the latest timestamp in the log (count > 0)
  return tonumber(redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2])
end

if cost > lim or count + cost > lim then
  local retry
  if cost > lim then
    retry = math.huge
  else
    local i = string.format('%d', off + count + cost - lim - 1)
    retry = tonumber(redis.call('ZRANGE', key, i, i, 'WITHSCORES')[2]) + period - now
  end
  local reset = 0
  if count > 0 then reset = newest() + period - now end
  local remaining = lim - count
  if remaining < 0 then remaining = 0 end
  return {0, lim, remaining, fmt(retry), fmt(reset), '0'}
end
if cost == 0 then
  local reset = 0
  if count > 0 then reset = newest() + period - now end
  return {1, lim, lim - count, '0', fmt(reset), '0'}
end
-- after the admission the latest entry is max(newest, now): it is now unless
-- some entry lies ahead of now (a clock that stepped back), which ZCOUNT tells
-- more cheaply than reading the newest entry (no score formatted and parsed)
local last = now
if count > 0 and redis.call('ZCOUNT', key, '(' .. nowstr, '+inf') > 0 then last = newest() end
if not dry then
  -- Members '<now>:<count + j>', j = 1..cost.  While now never steps back
  -- they are new: members stamped now were all added at this same now, with
  -- nothing removed since (the cutoff has not moved), so their numbers are
  -- <= count.  A now that steps back (a caller's clock, or TIME after an NTP
  -- step) can meet members of that earlier now numbered above a count that
  -- has shrunk since; ZADD NX then adds fewer than cost, and the rest go in
  -- one at a time under numbers above lim (this path only ever numbers
  -- <= count + cost <= lim), skipping any taken, so every unit of cost still
  -- gets its own entry.
  local added
  if cost == 1 then
    added = redis.call('ZADD', key, 'NX', nowstr, string.format('%s:%d', nowstr, count + 1))
  else
    added = 0
    local i = 1
    while i <= cost do -- in chunks: Lua's unpack() has a C-stack limit
      local args = {'NX'}
      local j = i
      while j <= cost and j < i + 1000 do
        args[#args + 1] = nowstr
        args[#args + 1] = string.format('%s:%d', nowstr, count + j)
        j = j + 1
      end
      added = added + redis.call('ZADD', key, unpack(args))
      i = j
    end
  end
  local n = lim
  while added < cost do
    n = n + 1
    added = added + redis.call('ZADD', key, 'NX', nowstr, string.format('%s:%d', nowstr, n))
  end
  redis.call('PEXPIRE', key, ttl) -- ceil(period in ms) + 1000
end
return admit(lim - count - cost, last + period - now)
