-- Shared by every netlimit script.  A script is per limit: limit_lua (redis.py) writes
-- the limit's constants as Lua literals in a first line (no ARGV to parse per call)
--   local lim, period, cap, ttl, queue, pack, nowstr_needed = ...
-- (lim, period: the rule; cap: the capacity, reported as Decision.limit; ttl: the
-- sliding log's key TTL in ms, as a string; queue: leaky bucket queue mode; pack:
-- see admit below, or nil; nowstr_needed: the script stores or scores now as text)
-- and then this prelude and <algorithm>.lua.
-- KEYS[1] state key.  ARGV, all optional: 1 cost (default '1'), 2 now (seconds;
-- '' or absent = the server's TIME), 3 dry run ('1' = never write).  The usual
-- call (cost 1, the server's clock, a real hit) passes none.
-- Floats go back as '%.17g' strings because Redis truncates Lua numbers to
-- integers; each such format is costly inside Redis, so an admission answers
-- with one integer where it can (admit), and every other answer is the table
-- {allowed, limit, remaining, retry_after, reset, delay}.
local function fmt(x) return string.format('%.17g', x) end
local key = KEYS[1]
local cost, dry = 1, false
local nowstr = ARGV[2]
if ARGV[1] then
  -- tonumber is a strtod inside Redis: the usual cost of 1 is recognised without one
  if ARGV[1] ~= '1' then cost = tonumber(ARGV[1]) end
  dry = ARGV[3] == '1'
end
local now
if nowstr and nowstr ~= '' then
  now = tonumber(nowstr)
else
  -- TIME before writes needs effects replication on Redis < 5; it is the only mode
  -- from 7.0 (which has REDIS_VERSION_NUM), where the call is only a cost
  if not redis.REDIS_VERSION_NUM and redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  if nowstr_needed then
    -- a decimal string whose value is exactly now (tonumber and Redis both read it
    -- with strtod): stored or scored as is, never formatted from the float
    nowstr = t[1] .. '.' .. string.sub('00000', #t[2]) .. t[2]
    now = tonumber(nowstr)
  else
    now = t[1] + t[2] / 1000000
  end
end
-- Write the state; it matters for `reset` more seconds, and its key outlives
-- that by one.  A window's state written again in the window its TTL was set
-- for (same) keeps that TTL (KEEPTTL, Redis >= 6.0; REDIS_VERSION_NUM, 7.0):
-- the end does not move, and there is no expiry to format and parse.
local function save(value, reset, same)
  if same and redis.REDIS_VERSION_NUM then
    redis.call('SET', key, value, 'KEEPTTL')
  else
    redis.call('SET', key, value, 'PX', string.format('%d', math.ceil(reset * 1000) + 1000))
  end
end
-- An admission: {1, cap, remaining, '0', reset, '0'}, or when the limit allows it
-- (pack, a power of two set by store.limit_lua so that (cap + 1) * pack <= 2^53)
-- the one integer remaining * pack + reset in microseconds (rounded), which
-- Redis passes on exactly and store._decode splits with divmod.
-- The fixed windows' stored state (fixed_window.lua, fixed_window_admitted.lua and their
-- lease script): the current window's index, its count and whether the key holds this
-- window ("<window index> <count>"); a later stored window wins (the clock stepped back).
local function window_state()
  local w = math.floor(now / period)
  local v = redis.call('GET', key)
  if v then
    local a, b = string.match(v, '^(%S+) (%S+)$')
    local sw = tonumber(a)
    if sw >= w then return sw, tonumber(b), true end
  end
  return w, 0, false
end
-- The buckets' stored state (bucket.lua and its lease script): the room left refilled to
-- now at `rate` per second (capped at cap), the last update time as stored text (nowstr
-- when refilled: no format), and whether the key existed.
local function bucket_state(rate)
  local v = redis.call('GET', key)
  if v then
    local a, b = string.match(v, '^(%S+) (%S+)$')
    local free, last = tonumber(a), tonumber(b)
    if now > last then
      free = free + (now - last) * rate
      if free > cap then free = cap end
      return free, nowstr, true
    end
    return free, b, true
  end
  return cap, nowstr, false
end
-- The sliding window counter (sliding_window_counter.lua and its lease script): the stored
-- state "<window index> <previous count> <current count>" as (window, previous, current,
-- whether the key holds this window); a later stored window wins (the clock stepped back).
local function swc_state()
  local w = math.floor(now / period)
  local v = redis.call('GET', key)
  if v then
    local a, b, c = string.match(v, '^(%S+) (%S+) (%S+)$')
    local sw = tonumber(a)
    if sw >= w then return sw, tonumber(b), tonumber(c), true end
    if sw == w - 1 then return w, tonumber(c), 0, false end
  end
  return w, 0, 0, false
end
-- its bound in window w: the window's start and hold, the largest integer with
-- x + hold <= lim, x the previous window's weighted share (the admission's comparison)
local function swc_hold(w, prev)
  local ws = w * period
  local elapsed = now - ws
  if elapsed < 0 then elapsed = 0 end
  local x = prev * (1 - elapsed / period)
  local hold = math.floor(lim - x)
  if x + (hold + 1) <= lim then
    hold = hold + 1
  elseif x + hold > lim then
    hold = hold - 1
  end
  return ws, hold
end
-- a denial's retry time (a cost above the limit never passes)
local function swc_retry(ws, prev, curr)
  if cost > lim then return math.huge end
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
  if t < now then return 0 end
  return t - now
end
-- when the counts (p previous, c current) stop mattering
local function swc_reset(w, p, c)
  if c > 0 then return (w + 2) * period - now end
  if p > 0 then return (w + 1) * period - now end
  return 0
end
local function admit(remaining, reset)
  if pack then
    local r = math.floor(reset * 1000000 + 0.5)
    if r >= 0 and r < pack then return remaining * pack + r end
  end
  return {1, cap, remaining, '0', fmt(reset), '0'}
end
