-- Leased quota for the token bucket and the leaky bucket without delay (a meter)
-- (stores/lease.py): one atomic call that
--   1. gives back ARGV[5] unused tokens of this sidecar's previous lease: the room
--      becomes min(cap, room + back), exactly the room the bucket would have had
--      had those hits never been taken (the difference only shrinks at the cap);
--   2. decides a hit of ARGV[1] (cost) exactly as bucket.lua does;
--   3. when the hit is admitted, takes up to ARGV[4] more tokens (whole ones,
--      what the room holds), like admitted hits.
-- Returns {allowed, limit, remaining, retry_after, reset, delay, granted, 0, given_back}
-- (floats as '%.17g' strings); remaining is after the reservation.
-- (stores/redis.py limit_lua and _prelude.lua define lim, period, cap, fmt, save, now,
-- nowstr, key, cost)

local extra = tonumber(ARGV[4]) or 0
local back = tonumber(ARGV[5]) or 0
local rate = lim / period
local free, lasts, v = bucket_state(rate) -- _prelude.lua
local given = 0
if back > 0 and v then
  given = back
  free = free + back
  if free > cap then free = cap end
end
if cost > free then
  local remaining = math.floor(free)
  if remaining < 0 then remaining = 0 end
  local retry
  if cost > cap then retry = math.huge else retry = (cost - free) / rate end
  if given > 0 then
    save(fmt(free) .. ' ' .. lasts, (cap - free) / rate)
  end
  return {0, cap, remaining, fmt(retry), fmt((cap - free) / rate), '0', 0, 0, given}
end
free = free - cost
local grant = math.floor(free)
if grant > extra then grant = extra end
if grant < 0 then grant = 0 end
free = free - grant
local reset = (cap - free) / rate
if cost > 0 or grant > 0 or given > 0 then
  save(fmt(free) .. ' ' .. lasts, reset)
end
return {1, cap, math.floor(free), '0', fmt(reset), '0', grant, 0, given}
