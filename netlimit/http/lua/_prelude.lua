-- Shared by every netlimit script: store.load_lua prepends it to <algorithm>.lua.
-- KEYS[1] state key; ARGV: 1 limit, 2 period (s), 3 capacity, 4 algorithm-specific,
-- 5 cost, 6 now (seconds; '' = use the server's TIME), 7 dry run ('1' = never write).
-- Floats go back as '%.17g' strings because Redis truncates Lua numbers to integers.
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
