-- Fixed window counter for a check of one rule: the same arguments (lib.lua), reply
-- (check.lua) and writes as the generic check script built with fixed_window.lua,
-- straight-line, as gcra_single.lua. Rust checks its verdict against
-- src/algorithm/fixed_window.rs as for every script.
-- `now` and `commit` come from single_now.lua, concatenated in front of this file;
-- `decide(key, o)` decides the rule whose 8 arguments are ARGV[o + 1 .. o + 8] (lib.lua's
-- order) on `key`, commits when it accepts in mode 'c', and returns the verdict (1/0) and
-- the three state fields it read. single_main.lua or batch_main.lua follows.
local function decide(key, o)
  -- ARGV[o + 2], ARGV[o + 3], ARGV[o + 6]: limit L, period W (µs), cost c.
  local p = rule(o, 'fw', 'fixed window', 2, 3, 6)
  local L, W, c = p[1], p[2], p[3]
  -- State 'window:count:born', or 0:0:now when absent (born: the earliest time a
  -- commit into it recorded; a refund of a commit before it gives nothing back).
  local sw, sn, sb = 0, 0, now
  local v = redis.call('GET', key)
  if v then
    sw, sn, sb = string.match(v, '([^:]+):([^:]+):([^:]+)')
    sw, sn, sb = sw + 0, sn + 0, sb + 0
  end
  local w = floordiv(now, W)
  -- The stored window when it is the next (the clock stepped back across its start).
  if sw == w + 1 then w = sw end
  local count = 0
  if sw == w then count = sn end
  -- accept iff count + c <= L
  local ok = count + c <= L
  if ok and commit then
    -- put(..., (w + 1)·W, now): always after now, so always a SET with ttl_ms. A state
    -- of this window was written with that very TTL (by every script's commit, and kept
    -- or lengthened by a refund's): it is kept (`KEEPTTL` costs Redis less than `PX`).
    -- born: the earliest time a commit into this state recorded (`at`: now, or the
    -- stored window's start when the clock stepped back before it)
    local at = now
    if w * W > at then at = w * W end
    if not v or at < sb then sb = at end
    local value = string.format('%d:%d:%d', w, count + c, sb)
    if server_time and sw == w then
      redis.call('SET', key, value, 'KEEPTTL')
    else
      redis.call('SET', key, value, 'PX', px((w + 1) * W))
    end
  end
  local r = ok and 1 or 0
  return r, sw, sn, 0
end
