-- netlimit token bucket; mirrors algorithms.token_bucket operation for operation.
-- KEYS[1] state key (string: "<tokens> <last update time>")
-- Returns {allowed, limit, remaining, retry_after, reset, delay} (floats as '%.17g'
-- strings), or for an admission admit() (_prelude.lua).  cap is the burst.
-- (store.limit_lua and _prelude.lua define lim, period, cap, fmt, save, admit, now,
-- nowstr, key, cost, dry)

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
local reset = (cap - tokens) / rate
if not dry then
  save(fmt(tokens) .. ' ' .. lasts, reset)
end
return admit(math.floor(tokens), reset)
