-- netlimit fixed window, admitted hits only (count_denied: false); mirrors algorithms.fixed_window_admitted.
-- KEYS[1] state key (string: "<window index> <count>"); cap = lim
-- Returns {allowed, limit, remaining, retry_after, reset, delay} (floats as '%.17g'
-- strings), or for an admission admit() (_prelude.lua).
-- (stores/redis.py limit_lua and _prelude.lua define lim, period, cap, fmt, save, admit, now,
-- key, cost, dry)

local w, count, same = window_state() -- _prelude.lua
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
  save(string.format('%d %d', w, new), reset, same)
end
return admit(lim - new, reset)
