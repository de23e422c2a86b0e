-- Shared by every netlimit script: store.load_lua prepends it to <algorithm>.lua.
-- KEYS[1] state key; ARGV: 1 limit, 2 period (s), 3 capacity, 4 algorithm-specific,
-- 5 cost, 6 now (seconds; '' = use the server's TIME), 7 dry run ('1' = never write).
-- Floats go back as '%.17g' strings because Redis truncates Lua numbers to integers.
local function fmt(x) return string.format('%.17g', x) end
-- nowstr: a decimal string whose value is exactly now (tonumber and Redis both
-- read it with strtod), so it can go to Redis as a score without fmt(now);
-- TIME gives '<seconds>.<microseconds, zero-padded to 6 digits>'.
local nowstr = ARGV[6]
if nowstr == '' then
  if redis.replicate_commands then redis.replicate_commands() end -- TIME before writes (Redis < 5)
  local t = redis.call('TIME')
  nowstr = t[1] .. '.' .. string.sub('00000', #t[2]) .. t[2]
end
local now = tonumber(nowstr)
local key = KEYS[1]
local lim = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local cost = tonumber(ARGV[5])
local dry = ARGV[7] == '1'
