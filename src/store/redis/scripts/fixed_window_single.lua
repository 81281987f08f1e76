-- Fixed window counter for a check of one rule: the same arguments (lib.lua), reply
-- (check.lua) and writes as the generic check script built with fixed_window.lua,
-- straight-line, as gcra_single.lua. Rust checks its verdict against
-- src/algorithm/fixed_window.rs as for every script.
-- `now` comes from single_now.lua, concatenated in front of this file.
if #KEYS ~= 1 or ARGV[3] ~= 'fw' then
  return redis.error_reply('tollgate: the single-rule fixed window script got ' .. #KEYS .. ' keys of ' .. tostring(ARGV[3]))
end
-- ARGV[4], ARGV[5], ARGV[8]: limit L, period W (µs), cost c.
local L, W, c = ARGV[4] + 0, ARGV[5] + 0, ARGV[8] + 0
-- State 'window:count', or 0:0 when absent.
local sw, sn = 0, 0
local v = redis.call('GET', KEYS[1])
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
if ok and ARGV[2] == 'c' then
  -- put(..., (w + 1)·W, now): always after now, so always a SET with ttl_ms.
  local a = (w + 1) * W - now + 999
  local q = math.floor(a / 1000)
  if q * 1000 > a then
    q = q - 1
  elseif (q + 1) * 1000 <= a then
    q = q + 1
  end
  redis.call('SET', KEYS[1], string.format('%d:%d', w, count + c), 'PX', string.format('%d', q + 1))
end
local r = ok and 1 or 0
return { now, r, r, sw, sn, 0, 0 }
