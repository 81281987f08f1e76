-- GCRA for a check of one rule, the common case: the same arguments (lib.lua), reply
-- (check.lua) and writes as the generic check script built with gcra.lua, straight-line.
-- The generic script builds its function table, a parameter table and its loop on every
-- call, which is most of its cost inside Redis: this one takes about half the CPU (see
-- docs/performance-redis.md). Rust checks its verdict against src/algorithm/gcra.rs as
-- for every script.
-- `now` and `commit` come from single_now.lua, concatenated in front of this file;
-- `decide(key, o)` decides the rule whose 8 arguments are ARGV[o + 1 .. o + 8] (lib.lua's
-- order) on `key`, commits when it accepts in mode 'c', and returns the verdict (1/0) and
-- the three state fields it read. single_main.lua or batch_main.lua follows.
local rules = {}
local function decide(key, o)
  -- ARGV[o + 4 .. o + 6]: burst B, emission interval T (µs), cost c, converted once per
  -- rule (a batch's decisions share their rule's arguments). `x + 0` converts like tonumber.
  local p = rules[o]
  if not p then
    if ARGV[o + 1] ~= 'gcra' then
      error('tollgate: the GCRA script got a rule of ' .. tostring(ARGV[o + 1]))
    end
    p = { ARGV[o + 4] + 0, ARGV[o + 5] + 0, ARGV[o + 6] + 0 }
    rules[o] = p
  end
  local B, T, c = p[1], p[2], p[3]
  -- State 'tat:gap' (the latest commit `gap` µs before the TAT), or none.
  local tat, last = 0, 0
  local v = redis.call('GET', key)
  if v then
    local gap
    tat, gap = string.match(v, '([^:]+):([^:]+)')
    tat = tat + 0
    last = tat - gap
  end
  local base = tat > now and tat or now
  -- with TAT' = max(TAT, now): accept iff c <= B and TAT' - now + c·T <= B·T
  local ok = c <= B and base - now + c * T <= B * T
  if ok and commit then
    local new = base + c * T
    -- lib.lua's ttl_ms(new, now): whole ms rounded up, plus one; floor(a / 1000) corrected
    -- for the rounding of the division, as floordiv does. Integers print exactly with %d.
    local a = new - now + 999
    local q = math.floor(a / 1000)
    if q * 1000 > a then
      q = q - 1
    elseif (q + 1) * 1000 <= a then
      q = q + 1
    end
    -- The latest commit is now (or later, when the clock stepped back): `gap` before `new`.
    local gap = new - (last > now and last or now)
    if gap < 0 then gap = 0 end
    redis.call('SET', key, string.format('%d:%d', new, gap), 'PX', string.format('%d', q + 1))
  end
  local r = ok and 1 or 0
  return r, tat, last, 0
end
