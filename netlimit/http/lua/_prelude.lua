-- Shared by every netlimit script: store.load_lua prepends it to <algorithm>.lua.
-- KEYS[1] state key; ARGV: 1 limit, 2 period (s), 3 capacity, 4 algorithm-specific,
-- 5 cost, 6 now (seconds; '' = use the server's TIME), 7 dry run ('1' = never write).
-- Floats go back as '%.17g' strings because Redis truncates Lua numbers to integers.
-- Each such format is costly inside Redis (a quarter of a fixed window call), so
-- integers are written with '%d', and an admission answers in the compact form
-- {1, remaining, x, nowstr} from which store.py computes reset exactly as the
-- script would (x: the window index, the bucket's '%.17g' room, or 0 for the
-- sliding log, whose reset is now + period - now); every other
-- answer is {allowed, limit, remaining, retry_after, reset, delay}.
local function fmt(x) return string.format('%.17g', x) end
-- nowstr: a decimal string whose value is exactly now (tonumber and Redis both
-- read it with strtod), so it can go to Redis as a score without fmt(now);
-- TIME gives '<seconds>.<microseconds, zero-padded to 6 digits>'.
local nowstr = ARGV[6]
if nowstr == '' then
  -- TIME before writes needs effects replication on Redis < 5; it is the only mode
  -- from 7.0 (which has REDIS_VERSION_NUM), where the call is only a cost
  if not redis.REDIS_VERSION_NUM and redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  nowstr = t[1] .. '.' .. string.sub('00000', #t[2]) .. t[2]
end
local now = tonumber(nowstr)
local key = KEYS[1]
local lim = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
-- tonumber is a strtod inside Redis: the capacity is parsed only by the bucket
-- scripts that use it, and the usual cost of 1 is recognised without a parse
local cost = ARGV[5] == '1' and 1 or tonumber(ARGV[5])
local dry = ARGV[7] == '1'
