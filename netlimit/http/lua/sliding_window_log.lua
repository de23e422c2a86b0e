-- netlimit sliding window log; mirrors algorithms.sliding_window_log.
-- KEYS[1] sorted set of admitted timestamps (one member per unit of cost)
-- KEYS[2] sequence counter that makes members unique (same hash tag as KEYS[1])
-- ARGV: 1 limit, 2 period (s), 3 capacity (= limit), 4 unused, 5 cost,
--       6 now (seconds; '' = use the server's TIME), 7 dry run ('1' = never add)
-- Returns {allowed, limit, remaining, retry_after, reset, delay}; floats as
-- '%.17g' strings because Redis truncates Lua numbers to integers.
-- (_prelude.lua, prepended at load, defines fmt, now, key, lim, period, cap, cost, dry)
local seqkey = KEYS[2]

-- entries stamped t expire when t <= now - period (window is (now - period, now])
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - period))
local count = redis.call('ZCARD', key)
local function score_at(i)
  return tonumber(redis.call('ZRANGE', key, i, i, 'WITHSCORES')[2])
end
local last = nil
if count > 0 then last = score_at(-1) end

if cost > lim or count + cost > lim then
  local retry
  if cost > lim then
    retry = math.huge
  else
    retry = score_at(count + cost - lim - 1) + period - now
  end
  local reset = 0
  if count > 0 then reset = last + period - now end
  local remaining = lim - count
  if remaining < 0 then remaining = 0 end
  return {0, lim, remaining, fmt(retry), fmt(reset), '0'}
end
if cost == 0 then
  local reset = 0
  if count > 0 then reset = last + period - now end
  return {1, lim, lim - count, '0', fmt(reset), '0'}
end
if last == nil or last < now then last = now end
if not dry then
  local seq = redis.call('INCRBY', seqkey, cost)
  local stamp = fmt(now)
  local i = 1
  while i <= cost do -- ZADD in chunks: Lua's unpack() has a C-stack limit
    local args = {}
    local j = i
    while j <= cost and j < i + 1000 do
      args[#args + 1] = stamp
      args[#args + 1] = tostring(seq - cost + j)
      j = j + 1
    end
    redis.call('ZADD', key, unpack(args))
    i = j
  end
  local ttl = math.ceil(period * 1000) + 1000
  redis.call('PEXPIRE', key, ttl)
  redis.call('PEXPIRE', seqkey, ttl)
end
return {1, lim, lim - count - cost, '0', fmt(last + period - now), '0'}
