-- Fixed window counter for a check of one rule: the same arguments (lib.lua), reply
-- (check.lua) and writes as the generic check script built with fixed_window.lua,
-- straight-line, as gcra_single.lua. Rust checks its verdict against
-- src/algorithm/fixed_window.rs as for every script.
-- `now` and `commit` come from single_now.lua, concatenated in front of this file;
-- `decide(key, o)` decides the rule whose 8 arguments are ARGV[o + 1 .. o + 8] (lib.lua's
-- order) on `key`, commits when it accepts in mode 'c', and returns the verdict (1/0) and
-- the three state fields it read. single_main.lua or batch_main.lua follows.
local rules = {}
local function decide(key, o)
  -- ARGV[o + 2], ARGV[o + 3], ARGV[o + 6]: limit L, period W (µs), cost c.
  -- Converted once per rule (a batch's decisions share their rule's arguments).
  local p = rules[o]
  if not p then
    if ARGV[o + 1] ~= 'fw' then
      error('tollgate: the fixed window script got a rule of ' .. tostring(ARGV[o + 1]))
    end
    p = { ARGV[o + 2] + 0, ARGV[o + 3] + 0, ARGV[o + 6] + 0 }
    rules[o] = p
  end
  local L, W, c = p[1], p[2], p[3]
  -- State 'window:count', or 0:0 when absent.
  local sw, sn = 0, 0
  local v = redis.call('GET', key)
  if v then
    sw, sn = string.match(v, '([^:]+):([^:]+)')
    sw, sn = sw + 0, sn + 0
  end
  -- w = floor(now / W), corrected for the rounding of the division (lib.lua's floordiv).
  local w = math.floor(now / W)
  if w * W > now then
    w = w - 1
  elseif (w + 1) * W <= now then
    w = w + 1
  end
  -- The stored window when it is the next (the clock stepped back across its start).
  if sw == w + 1 then w = sw end
  local count = 0
  if sw == w then count = sn end
  -- accept iff count + c <= L
  local ok = count + c <= L
  if ok and commit then
    -- put(..., (w + 1)·W, now): always after now, so always a SET with ttl_ms.
    local a = (w + 1) * W - now + 999
    local q = math.floor(a / 1000)
    if q * 1000 > a then
      q = q - 1
    elseif (q + 1) * 1000 <= a then
      q = q + 1
    end
    redis.call('SET', key, string.format('%d:%d', w, count + c), 'PX', string.format('%d', q + 1))
  end
  local r = ok and 1 or 0
  return r, sw, sn, 0
end
