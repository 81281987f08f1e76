-- Main of the straight-line multi-check batch script (group commit, src/store/redis/batch.rs):
-- multi_batch.lua's arguments and reply, for multi-checks whose rules are all straight-line
-- (a cost, no shadow rule, no block): each rule is decided by its algorithm's own
-- `decide(key, o)` from <algorithm>_single.lua (kept in DECIDE by tag), at about half the
-- generic script's work. `commit` (single_now.lua) is what those functions commit by: the
-- rules before the last are decided without it; the last is decided and committed at once
-- when every rule before it accepted; then, if it accepted too, the rules before it are
-- decided again, committing (their states are as they were: nothing else ran between).
-- A failure (a key of another type) comes before any write; a decision that would leave
-- the sliding window log's O(1) path answers 3 before any write, and every later
-- multi-check sharing a key with it too.
local m = ARGV[3] + 0
local deferred = {}

local function decide_multi(k0, n)
  for i = 1, n do
    if deferred[KEYS[k0 + i]] then return 3 end
  end
  local fields = {}
  local all = true
  for i = 1, n do
    local o = ARGV[3 + m + k0 + i] + 0
    local d = DECIDE[ARGV[o + 1]]
    if not d then error('tollgate: this script does not handle algorithm ' .. tostring(ARGV[o + 1])) end
    commit = i == n and all
    local r, f1, f2, f3 = d(KEYS[k0 + i], o)
    if r == 3 then return 3 end
    if r ~= 1 then all = false end
    fields[4 * i - 3], fields[4 * i - 2], fields[4 * i - 1], fields[4 * i] = r, f1, f2, f3
  end
  if all then
    commit = true
    for i = 1, n - 1 do
      local o = ARGV[3 + m + k0 + i] + 0
      DECIDE[ARGV[o + 1]](KEYS[k0 + i], o)
    end
  end
  return all and 1 or 0, fields
end

local out = { now }
local k0 = 0
for j = 1, m do
  local n = ARGV[3 + j] + 0
  local at = #out + 1
  local ok, status, fields = pcall(decide_multi, k0, n)
  if not ok then
    local e = type(status) == 'table' and status.err or tostring(status)
    if string.sub(e, 1, 8) == 'READONLY' or string.sub(e, 1, 10) == 'MASTERDOWN' then
      return redis.error_reply(e)
    end
    out[at], out[at + 1] = 2, e
    for i = 2, 4 * n do out[at + i] = 0 end
  elseif status == 3 then
    for i = 1, n do deferred[KEYS[k0 + i]] = true end
    for i = 0, 4 * n do out[at + i] = 0 end
    out[at] = 3
  else
    out[at] = status
    for i = 1, 4 * n do out[at + i] = fields[i] end
  end
  k0 = k0 + n
end
return out
