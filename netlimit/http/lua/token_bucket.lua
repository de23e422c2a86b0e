-- netlimit token bucket; mirrors algorithms.token_bucket operation for operation.
-- KEYS[1] state key (string: "<tokens> <last update time>")
-- ARGV: 1 limit, 2 period (s), 3 capacity (burst), 4 unused, 5 cost,
--       6 now (seconds; '' = use the server's TIME), 7 dry run ('1' = never write)
-- Returns {allowed, limit, remaining, retry_after, reset, delay} (floats as '%.17g'
-- strings), or for an admission without a queue delay {1, remaining, room, nowstr}
-- with room as '%.17g' (_prelude.lua).
-- (_prelude.lua, prepended at load, defines fmt, now, key, lim, period, cost, dry)
local cap = tonumber(ARGV[3])

local rate = lim / period
local tokens, last
local lasts -- last as stored: the string it was read from, or nowstr (no format)
local v = redis.call('GET', key)
if v then
  local a, b = string.match(v, '^(%S+) (%S+)$')
  tokens = tonumber(a)
  last = tonumber(b)
  lasts = b
  if now > last then
    tokens = tokens + (now - last) * rate
    if tokens > cap then tokens = cap end
    last = now
    lasts = nowstr
  end
else
  tokens = cap
  last = now
  lasts = nowstr
end
if cost > tokens then
  local remaining = math.floor(tokens)
  if remaining < 0 then remaining = 0 end
  local retry
  if cost > cap then retry = math.huge else retry = (cost - tokens) / rate end
  return {0, cap, remaining, fmt(retry), fmt((cap - tokens) / rate), '0'}
end
if cost == 0 then
  return {1, cap, math.floor(tokens), '0', fmt((cap - tokens) / rate), '0'}
end
tokens = tokens - cost
local ts = fmt(tokens)
if not dry then
  local reset = (cap - tokens) / rate
  redis.call('SET', key, ts .. ' ' .. lasts, 'PX', string.format('%d', math.ceil(reset * 1000) + 1000))
end
return {1, math.floor(tokens), ts, nowstr} -- compact: reset = (cap - tokens) / rate
