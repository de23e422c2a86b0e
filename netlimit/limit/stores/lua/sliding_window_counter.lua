-- netlimit sliding window counter (Cloudflare's approximation);
-- mirrors algorithms.sliding_window_counter.
-- KEYS[1] state key (string: "<window index> <previous count> <current count>"); cap = lim
-- Returns {allowed, limit, remaining, retry_after, reset, delay} (floats as '%.17g'
-- strings), or for an admission admit() (_prelude.lua).
-- (stores/redis.py limit_lua and _prelude.lua define lim, period, cap, fmt, save, admit, now,
-- key, cost, dry)

local w = math.floor(now / period)
local prev, curr = 0, 0
local same = false
local v = redis.call('GET', key)
if v then
  local a, b, c = string.match(v, '^(%S+) (%S+) (%S+)$')
  local sw = tonumber(a)
  if sw >= w then
    w = sw
    prev = tonumber(b)
    curr = tonumber(c)
    same = true
  elseif sw == w - 1 then
    prev = tonumber(c)
  end
end
local ws = w * period
local elapsed = now - ws
if elapsed < 0 then elapsed = 0 end
local x = prev * (1 - elapsed / period) -- the previous window's weighted share
-- hold = the largest integer with x + hold <= lim (same comparison as admission)
local hold = math.floor(lim - x)
if x + (hold + 1) <= lim then
  hold = hold + 1
elseif x + hold > lim then
  hold = hold - 1
end
local n = curr + cost

local function reset_of(p, c)
  if c > 0 then return (w + 2) * period - now end
  if p > 0 then return (w + 1) * period - now end
  return 0
end

if cost > lim or n > hold then
  local retry
  if cost > lim then
    retry = math.huge
  else
    local room = lim - cost - curr
    local t
    if room >= 0 and prev > 0 then
      t = ws + period * (1 - room / prev)
    else
      room = lim - cost
      if curr <= room then
        t = ws + period
      else
        t = ws + period + period * (1 - room / curr)
      end
    end
    retry = t - now
    if retry < 0 then retry = 0 end
  end
  local remaining = hold - curr
  if remaining < 0 then remaining = 0 end
  return {0, lim, remaining, fmt(retry), fmt(reset_of(prev, curr)), '0'}
end
if cost == 0 then
  return {1, lim, hold - n, '0', fmt(reset_of(prev, curr)), '0'}
end
local reset = (w + 2) * period - now
if not dry then
  save(string.format('%d %d %d', w, prev, n), reset, same)
end
return admit(hold - n, reset)
