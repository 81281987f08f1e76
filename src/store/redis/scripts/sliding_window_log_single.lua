-- The sliding window log for a check of one rule, and for group commit: `decide(key, o)`
-- as the other algorithms' <algorithm>_single.lua, over sliding_window_log.lua's functions
-- (after lib.lua, sliding_window_log.lua and single_now.lua; then single_main.lua or
-- batch_main.lua). The same reads, writes and reply as the generic check script.
--
-- In a batch of several decisions, each stays O(1): one that would read past the head
-- of its log (a long expired prefix, the k-th unit of a rejection past the head) is
-- neither decided nor written, and answers 3, "send me on my own"; so does every later
-- decision on the same key, which must be decided after it. Alone, a decision reads
-- what it needs.
local bounded = #KEYS > 1
local deferred = {}
local swl_rules = {}

local function decide(key, o)
  if deferred[key] then return 3, 0, 0, 0 end
  local p = swl_rules[o]
  if not p then
    if ARGV[o + 1] ~= 'swl' then
      error('tollgate: the sliding window log script got a rule of ' .. tostring(ARGV[o + 1]))
    end
    -- ARGV[o + 2], [o + 3], [o + 6]: limit L, period W (µs), cost c.
    p = { L = ARGV[o + 2] + 0, W = ARGV[o + 3] + 0, c = ARGV[o + 6] + 0 }
    swl_rules[o] = p
  end
  local s = ALG.swl.read(key, p, now, bounded)
  if s == false then
    deferred[key] = true
    return 3, 0, 0, 0
  end
  s = s or ALG.swl.default()
  local ok = s[1] + p.c <= p.L
  if ok and commit then ALG.swl.commit(key, s, p, now) end
  return ok and 1 or 0, s[1], s[2], s[3]
end
