-- netlimit leaky bucket; mirrors algorithms.leaky_bucket (algorithms._bucket)
-- operation for operation.  The state is the room left in the bucket
-- (capacity - level), which keeps integer boundaries exact, exactly as the
-- token bucket's tokens.  Meter mode: admitted if it fits.  Queue mode
-- (ARGV[4] = '1', ARGV[3] is then capacity + 1, nginx burst semantics):
-- admitted if it fits, delay = level / rate.
-- KEYS[1] state key (string: "<room> <last update time>")
-- ARGV: 1 limit, 2 period (s), 3 capacity, 4 queue flag, 5 cost,
--       6 now (seconds; '' = use the server's TIME), 7 dry run ('1' = never write)
-- Returns {allowed, limit, remaining, retry_after, reset, delay} (floats as '%.17g'
-- strings), or for an admission without a queue delay {1, remaining, room, nowstr}
-- with room as '%.17g' (_prelude.lua).
-- (_prelude.lua, prepended at load, defines fmt, now, key, lim, period, cost, dry)
local cap = tonumber(ARGV[3])
local queue = ARGV[4] == '1'

local rate = lim / period
local free, last
local lasts -- last as stored: the string it was read from, or nowstr (no format)
local v = redis.call('GET', key)
if v then
  local a, b = string.match(v, '^(%S+) (%S+)$')
  free = tonumber(a)
  last = tonumber(b)
  lasts = b
  if now > last then
    free = free + (now - last) * rate
    if free > cap then free = cap end
    last = now
    lasts = nowstr
  end
else
  free = cap
  last = now
  lasts = nowstr
end
if cost > free then
  local remaining = math.floor(free)
  if remaining < 0 then remaining = 0 end
  local retry
  if cost > cap then retry = math.huge else retry = (cost - free) / rate end
  return {0, cap, remaining, fmt(retry), fmt((cap - free) / rate), '0'}
end
local delay = 0
if queue then delay = (cap - free) / rate end
if cost == 0 then
  return {1, cap, math.floor(free), '0', fmt((cap - free) / rate), fmt(delay)}
end
free = free - cost
local fs = fmt(free)
local reset = (cap - free) / rate
if not dry then
  redis.call('SET', key, fs .. ' ' .. lasts, 'PX', string.format('%d', math.ceil(reset * 1000) + 1000))
end
if not queue then
  return {1, math.floor(free), fs, nowstr} -- compact: reset = (cap - free) / rate
end
return {1, cap, math.floor(free), '0', fmt(reset), fmt(delay)}
