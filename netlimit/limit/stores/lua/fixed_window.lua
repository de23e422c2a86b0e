-- Lyft's fixed window (every hit counts, admitted or not); mirrors algorithms.fixed_window.
-- KEYS[1] state key (string: "<window index> <count>", the count saturated at lim + 1); cap = lim
-- Returns {allowed, limit, remaining, retry_after, reset, delay} (floats as '%.17g'
-- strings), or for an admission admit() (_prelude.lua).
-- (stores/redis.py limit_lua and _prelude.lua define lim, period, cap, fmt, save, admit, now,
-- key, cost, dry)

local w, count, same = window_state() -- _prelude.lua
local reset = (w + 1) * period - now
local new = count + cost
if new > lim then
  -- over: the hits count all the same, saturated at lim + 1 (written once per window)
  if count <= lim and not dry then
    save(string.format('%d %d', w, lim + 1), reset, same)
  end
  if cost > lim then
    return {0, lim, 0, fmt(math.huge), fmt(reset), '0'}
  end
  return {0, lim, 0, fmt(reset), fmt(reset), '0'}
end
if cost > 0 and not dry then
  save(string.format('%d %d', w, new), reset, same)
end
return admit(lim - new, reset)
