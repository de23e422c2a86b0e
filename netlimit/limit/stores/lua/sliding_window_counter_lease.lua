-- Leased quota for the sliding window counter (stores/lease.py); mirrors
-- sliding_window_counter.lua, in one atomic call that
--   1. gives back ARGV[5] unused units of this sidecar's previous lease, reserved in
--      window ARGV[6], from the current count when that window is still the current one;
--   2. decides a hit of ARGV[1] (cost) exactly as sliding_window_counter.lua does;
--   3. when the hit is admitted, reserves up to ARGV[4] more units in the current
--      window's count (within the same bound as admissions: hold).
-- A unit reserved in window w counts in w whenever it is spent before w ends, and
-- the previous window's weight only falls as w goes on: spending it later admits
-- nothing the algorithm would not.
-- Returns {allowed, limit, remaining, retry_after, reset, delay, granted, window,
-- given_back, seconds to the window's end} (floats as '%.17g' strings).
-- (stores/redis.py limit_lua and _prelude.lua define lim, period, fmt, save, now, key, cost)

local extra = tonumber(ARGV[4]) or 0
local back = tonumber(ARGV[5]) or 0
local bw = tonumber(ARGV[6])

local w, prev, curr, same = swc_state() -- _prelude.lua
local given = 0
if back > 0 and same and bw == w then
  given = back
  if given > curr then given = curr end
  curr = curr - given
end
local ws, hold = swc_hold(w, prev)
local n = curr + cost

if cost > lim or n > hold then
  local retry = swc_retry(ws, prev, curr)
  local remaining = hold - curr
  if remaining < 0 then remaining = 0 end
  if given > 0 then
    save(string.format('%d %d %d', w, prev, curr), (w + 2) * period - now, same)
  end
  return {0, lim, remaining, fmt(retry), fmt(swc_reset(w, prev, curr)), '0', 0, w, given, fmt((w + 1) * period - now)}
end
local grant = hold - n
if grant > extra then grant = extra end
if grant < 0 then grant = 0 end
n = n + grant
local reset = (w + 2) * period - now
if cost > 0 or grant > 0 or given > 0 then
  save(string.format('%d %d %d', w, prev, n), reset, same)
end
return {1, lim, hold - n, '0', fmt(reset), '0', grant, w, given, fmt((w + 1) * period - now)}
