-- Main of the single-rule scripts: `decide` (from <algorithm>_single.lua) on the one key,
-- replying as check.lua does for one rule: { now, all accepted, accepted, f1, f2, f3, 0 }.
if #KEYS ~= 1 then
  return redis.error_reply('tollgate: a single-rule script got ' .. #KEYS .. ' keys')
end
local r, f1, f2, f3 = decide(KEYS[1], 2)
return { now, r, r, f1, f2, f3, 0 }
