-- netlimit leaky bucket; mirrors algorithms.leaky_bucket operation for operation.
-- Meter mode: admitted if it fits.  Queue mode (ARGV[4] = '1', ARGV[3] is then
-- capacity + 1, nginx burst semantics): admitted if it fits, delay = level / rate.
-- KEYS[1] state key (string: "<level> <last update time>")
-- ARGV: 1 limit, 2 period (s), 3 capacity, 4 queue flag, 5 cost,
--       6 now (seconds; '' = use the server's TIME), 7 dry run ('1' = never write)
-- Returns {allowed, limit, remaining, retry_after, reset, delay}; floats as
-- '%.17g' strings because Redis truncates Lua numbers to integers.
local function fmt(x) return string.format('%.17g', x) end
local now
if ARGV[6] ~= '' then
  now = tonumber(ARGV[6])
else
  if redis.replicate_commands then redis.replicate_commands() end -- TIME before writes (Redis < 5)
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local key = KEYS[1]
local lim = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local queue = ARGV[4] == '1'
local cost = tonumber(ARGV[5])
local dry = ARGV[7] == '1'

local rate = lim / period
local level, last
local v = redis.call('GET', key)
if v then
  local a, b = string.match(v, '^(%S+) (%S+)$')
  level = tonumber(a)
  last = tonumber(b)
  if now > last then
    level = level - (now - last) * rate
    if level < 0 then level = 0 end
    last = now
  end
else
  level = 0
  last = now
end
if cost > cap or level + cost > cap then
  local remaining = math.floor(cap - level)
  if remaining < 0 then remaining = 0 end
  local retry
  if cost > cap then retry = math.huge else retry = (level + cost - cap) / rate end
  return {0, cap, remaining, fmt(retry), fmt(level / rate), '0'}
end
local delay = 0
if queue then delay = level / rate end
if cost == 0 then
  return {1, cap, math.floor(cap - level), '0', fmt(level / rate), fmt(delay)}
end
level = level + cost
local remaining = math.floor(cap - level)
if remaining < 0 then remaining = 0 end
local reset = level / rate
if not dry then
  redis.call('SET', key, fmt(level) .. ' ' .. fmt(last), 'PX', math.ceil(reset * 1000) + 1000)
end
return {1, cap, remaining, '0', fmt(reset), fmt(delay)}
