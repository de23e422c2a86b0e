-- netlimit token bucket and leaky bucket (one script: a leaky bucket as a meter is
-- a token bucket); mirrors algorithms/bucket.py (_bucket) operation for operation.
-- The state is the room left: tokens, or capacity - level for the leaky bucket,
-- which keeps integer boundaries exact.  cap is the burst.  Leaky bucket queue
-- mode (queue = true; cap is then capacity + 1, nginx burst semantics): admitted
-- if it fits, delay = level / rate.
-- KEYS[1] state key (string: "<room> <last update time>")
-- Returns {allowed, limit, remaining, retry_after, reset, delay} (floats as '%.17g'
-- strings), or for an admission without queueing admit() (_prelude.lua).
-- (stores/redis.py limit_lua and _prelude.lua define lim, period, cap, queue, fmt,
-- save, admit, now, nowstr, key, cost, dry)

local rate = lim / period
local free, lasts = bucket_state(rate) -- _prelude.lua; lasts: the stored time as text
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
local reset = (cap - free) / rate
if not dry then
  save(fmt(free) .. ' ' .. lasts, reset)
end
if not queue then
  return admit(math.floor(free), reset)
end
return {1, cap, math.floor(free), '0', fmt(reset), fmt(delay)}
