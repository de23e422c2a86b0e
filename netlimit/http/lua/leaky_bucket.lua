-- netlimit leaky bucket (GCRA in token units); mirrors algorithms.leaky_bucket.
-- Meter mode: admitted if it fits.  Queue mode (ARGV[4] = 1, capacity already +1):
-- admitted if it fits, delay = time until its slot.
-- KEYS[1] state key (string: theoretical arrival time in token units)
-- ARGV: 1 limit, 2 period (s), 3 capacity (+1 in queue mode), 4 queue flag, 5 cost,
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
local cost = tonumber(ARGV[5])
local dry = ARGV[7] == '1'
local queue = ARGV[4] == '1'

local rate = lim / period
local now_u = now * rate
local tat = tonumber(redis.call('GET', key))
local base
if tat == nil or tat < now_u then base = now_u else base = tat end
if cost > cap then
  local remaining = math.floor(cap - (base - now_u))
  if remaining < 0 then remaining = 0 end
  return {0, cap, remaining, fmt(math.huge), fmt((base - now_u) / rate), '0'}
end
local new_tat = base + cost
local over = new_tat - now_u - cap
if over > 0 then
  local remaining = math.floor(cap - (base - now_u))
  if remaining < 0 then remaining = 0 end
  return {0, cap, remaining, fmt(over / rate), fmt((base - now_u) / rate), '0'}
end
local remaining = math.floor(cap - (new_tat - now_u))
if remaining < 0 then remaining = 0 end
local reset = (new_tat - now_u) / rate
if cost > 0 and not dry then
  redis.call('SET', key, fmt(new_tat), 'PX', math.ceil(reset * 1000) + 1000)
end
local delay = 0
if queue then delay = (base - now_u) / rate end
return {1, cap, remaining, '0', fmt(reset), fmt(delay)}
