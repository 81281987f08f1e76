-- Leaky bucket (shaper) for a check of one rule: the same arguments (lib.lua), reply
-- (check.lua) and writes as the generic check script built with leaky_bucket.lua,
-- straight-line, as gcra_single.lua. Rust checks its verdict against
-- src/algorithm/leaky_bucket.rs as for every script.
-- `now` comes from single_now.lua, concatenated in front of this file.
if #KEYS ~= 1 or ARGV[3] ~= 'lb' then
  return redis.error_reply('tollgate: the single-rule leaky bucket script got ' .. #KEYS .. ' keys of ' .. tostring(ARGV[3]))
end
-- ARGV[6..9]: burst B, emission interval T (µs), cost c, max delay (µs).
local B, T, c, md = ARGV[6] + 0, ARGV[7] + 0, ARGV[8] + 0, ARGV[9] + 0
-- State 'next', the next free slot, or 0 when absent.
local v = redis.call('GET', KEYS[1])
local nxt = v and v + 0 or 0
local base = nxt > now and nxt or now
local delay = base - now
-- accept iff c <= B + 1, the last unit waits at most B·T, and the delay <= max delay
local ok = c <= B + 1 and delay + (c - 1) * T <= B * T and delay <= md
if ok and ARGV[2] == 'c' then
  local new = base + c * T
  if new <= now then
    redis.call('DEL', KEYS[1])
  else
    local a = new - now + 999
    local q = math.floor(a / 1000)
    if q * 1000 > a then
      q = q - 1
    elseif (q + 1) * 1000 <= a then
      q = q + 1
    end
    redis.call('SET', KEYS[1], string.format('%d', new), 'PX', string.format('%d', q + 1))
  end
end
local r = ok and 1 or 0
return { now, r, r, nxt, 0, 0, 0 }
