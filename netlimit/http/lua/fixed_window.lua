-- netlimit fixed window; mirrors algorithms.fixed_window.
-- KEYS[1] state key (string: "<window index> <count>")
-- ARGV: 1 limit, 2 period (s), 3 capacity (= limit), 4 unused, 5 cost,
--       6 now (seconds; '' = use the server's TIME), 7 dry run ('1' = never write)
-- Returns {allowed, limit, remaining, retry_after, reset, delay} (floats as '%.17g'
-- strings), or for an admission {1, remaining, w, nowstr} (_prelude.lua).
-- (_prelude.lua, prepended at load, defines fmt, now, key, lim, period, cost, dry)

local w = math.floor(now / period)
local count = 0
local v = redis.call('GET', key)
if v then
  local a, b = string.match(v, '^(%S+) (%S+)$')
  local sw = tonumber(a)
  if sw >= w then -- same window (or the clock stepped back: keep the later one)
    w = sw
    count = tonumber(b)
  end
end
local reset = (w + 1) * period - now
local remaining = lim - count
if remaining < 0 then remaining = 0 end
if cost > lim then
  return {0, lim, remaining, fmt(math.huge), fmt(reset), '0'}
end
local new = count + cost
if new > lim then
  return {0, lim, remaining, fmt(reset), fmt(reset), '0'}
end
if cost > 0 and not dry then
  redis.call('SET', key, string.format('%d %d', w, new), 'PX', string.format('%d', math.ceil(reset * 1000) + 1000))
end
return {1, lim - new, w, nowstr} -- compact: reset = (w + 1) * period - now
