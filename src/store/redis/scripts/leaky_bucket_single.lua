-- Leaky bucket (shaper) for a check of one rule: the same arguments (lib.lua), reply
-- (check.lua) and writes as the generic check script built with leaky_bucket.lua,
-- straight-line, as gcra_single.lua. Rust checks its verdict against
-- src/algorithm/leaky_bucket.rs as for every script.
-- `now` and `commit` come from single_now.lua, concatenated in front of this file;
-- `decide(key, o)` decides the rule whose 8 arguments are ARGV[o + 1 .. o + 8] (lib.lua's
-- order) on `key`, commits when it accepts in mode 'c', and returns the verdict (1/0) and
-- the three state fields it read. single_main.lua or batch_main.lua follows.
local function decide(key, o)
  -- ARGV[o + 4 .. o + 7]: burst B, emission interval T (µs), cost c, max delay (µs).
  local p = rule(o, 'lb', 'leaky bucket', 4, 5, 6, 7)
  local B, T, c, md = p[1], p[2], p[3], p[4]
  -- State 'next', the next free slot, or 0 when absent.
  local v = redis.call('GET', key)
  local nxt = v and v + 0 or 0
  local base = nxt > now and nxt or now
  local delay = base - now
  -- accept iff c <= B + 1, the last unit waits at most B·T, and the delay <= max delay
  local ok = c <= B + 1 and delay + (c - 1) * T <= B * T and delay <= md
  if ok and commit then
    local new = base + c * T
    if new <= now then
      redis.call('DEL', key)
    else
      redis.call('SET', key, string.format('%d', new), 'PX', px(new))
    end
  end
  local r = ok and 1 or 0
  return r, nxt, 0, 0
end
