-- netlimit sliding window counter (Cloudflare's approximation);
-- mirrors algorithms.sliding_window_counter.
-- KEYS[1] state key (string: "<window index> <previous count> <current count>"); cap = lim
-- Returns {allowed, limit, remaining, retry_after, reset, delay} (floats as '%.17g'
-- strings), or for an admission admit() (_prelude.lua).
-- (stores/redis.py limit_lua and _prelude.lua define lim, period, cap, fmt, save, admit, now,
-- key, cost, dry)

local w, prev, curr, same = swc_state() -- _prelude.lua
local ws, hold = swc_hold(w, prev)
local n = curr + cost

if cost > lim or n > hold then
  local retry = swc_retry(ws, prev, curr)
  local remaining = hold - curr
  if remaining < 0 then remaining = 0 end
  return {0, lim, remaining, fmt(retry), fmt(swc_reset(w, prev, curr)), '0'}
end
if cost == 0 then
  return {1, lim, hold - n, '0', fmt(swc_reset(w, prev, curr)), '0'}
end
local reset = (w + 2) * period - now
if not dry then
  save(string.format('%d %d %d', w, prev, n), reset, same)
end
return admit(hold - n, reset)
