-- Leased quota for both fixed windows (stores/lease.py): one atomic call that
--   1. gives back the unused part of this sidecar's previous lease on the key
--      (ARGV[5] units reserved in window ARGV[6]), only when that window is still
--      the key's current one and it is not saturated (over the limit, Lyft's
--      counting keeps it over to its end);
--   2. decides a hit of ARGV[1] (cost) exactly as fixed_window.lua /
--      fixed_window_admitted.lua do;
--   3. when the hit is admitted, reserves up to ARGV[4] more units (capped by
--      what remains in the window), charged to the window's count like admitted
--      hits, so the shared count never lets anyone past the limit.
-- counts_denied is written by lease.py before this file (fixed_window: true).
-- Returns {allowed, limit, remaining, retry_after, reset, delay, granted, window, given_back}
-- (floats as '%.17g' strings); remaining is after the reservation.
-- (stores/redis.py limit_lua and _prelude.lua define lim, period, fmt, save, now, key, cost)

local extra = tonumber(ARGV[4]) or 0
local back = tonumber(ARGV[5]) or 0
local bw = tonumber(ARGV[6])
local w, count, same = window_state() -- _prelude.lua
local given = 0
if back > 0 and same and bw == w and count <= lim then
  given = back
  if given > count then given = count end
  count = count - given
end
local reset = (w + 1) * period - now
local new = count + cost
if new > lim then
  local remaining = 0
  if counts_denied then
    if count <= lim then
      save(string.format('%d %d', w, lim + 1), reset, same)
    end
  else
    remaining = lim - count
    if remaining < 0 then remaining = 0 end
    if given > 0 then
      save(string.format('%d %d', w, count), reset, same)
    end
  end
  local ra = reset
  if cost > lim then ra = math.huge end
  return {0, lim, remaining, fmt(ra), fmt(reset), '0', 0, w, given}
end
local grant = lim - new
if grant > extra then grant = extra end
if grant < 0 then grant = 0 end
new = new + grant
if cost > 0 or grant > 0 or given > 0 then
  save(string.format('%d %d', w, new), reset, same)
end
return {1, lim, lim - new, '0', fmt(reset), '0', grant, w, given}
