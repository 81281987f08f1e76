-- GCRA for a check of one rule, the common case: the same arguments (lib.lua), reply
-- (check.lua) and writes as the generic check script built with gcra.lua, straight-line.
-- The generic script builds its function table, a parameter table and its loop on every
-- call, which is most of its cost inside Redis: this one takes about half the CPU (see
-- docs/performance.md). Rust checks its verdict against src/algorithm/gcra.rs as
-- for every script.
-- `now` and `commit` come from single_now.lua, concatenated in front of this file;
-- `decide(key, o)` decides the rule whose 8 arguments are ARGV[o + 1 .. o + 8] (lib.lua's
-- order) on `key`, commits when it accepts in mode 'c', and returns the verdict (1/0) and
-- the three state fields it read. single_main.lua or batch_main.lua follows.
local function decide(key, o)
  -- ARGV[o + 4 .. o + 6]: burst B, emission interval T (µs), cost c.
  local p = rule(o, 'gcra', 'GCRA', 4, 5, 6)
  local B, T, c = p[1], p[2], p[3]
  -- State 'tat:gap[:left]' (the latest commit `gap` µs before the TAT; the key expires
  -- `left` µs after the TAT, when this script set its expiry), or none.
  local tat, last, left = 0, 0, nil
  local v = redis.call('GET', key)
  if v then
    local gap, l
    tat, gap, l = string.match(v, '([^:]+):([^:]+):?([^:]*)')
    tat = tat + 0
    last = tat - gap
    if l ~= '' then left = l + 0 end
  end
  local base = tat > now and tat or now
  -- with TAT' = max(TAT, now): accept iff c <= B and TAT' - now + c·T <= B·T
  local ok = c <= B and base - now + c * T <= B * T
  if ok and commit then
    local new = base + c * T
    -- The latest commit is now (or later, when the clock stepped back): `gap` before `new`.
    local gap = new - (last > now and last or now)
    if gap < 0 then gap = 0 end
    -- The key must live until `new`. When the expiry this script gave it already reaches
    -- that far, the TTL is kept (`SET … KEEPTTL` costs Redis about 0.7 µs less than
    -- `SET … PX`); else it is set to `new` plus the state's remaining life, at most 10 s:
    -- a key outlives its state by at most that, and a busy key's TTL is set again only
    -- once its TAT has moved on by as much.
    local expires = left and tat + left
    if server_time and expires and new <= expires then
      redis.call('SET', key, string.format('%d:%d:%d', new, gap, expires - new), 'KEEPTTL')
    else
      local slack = new - now
      if slack > 10000000 then slack = 10000000 end
      redis.call('SET', key, string.format('%d:%d:%d', new, gap, slack), 'PX', px(new + slack))
    end
  end
  local r = ok and 1 or 0
  return r, tat, last, 0
end
