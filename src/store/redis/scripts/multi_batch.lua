-- Main of the multi-check batch script (group commit, src/store/redis/batch.rs): several
-- multi-checks (the rules of one input, e.g. a rate rule and a concurrency rule on one
-- key), each decided all or nothing as check.lua decides one call's rules, in the order of
-- KEYS, at one `now` (one TIME). A multi-check reads the state the ones before it left.
--
-- ARGV[1] now (or '' for TIME), ARGV[2] mode ('c'), ARGV[3] m, the number of
-- multi-checks; ARGV[3 + j] (j = 1..m) the number of rules of multi-check j, followed by
-- one letter per rule when any is a shadow rule ('e' enforced, 's' shadow); then
-- ARGV[3 + m + r] (r = 1..R, every rule of every multi-check, in KEYS order) the offset o
-- of rule r's 8 arguments (lib.lua's order), ARGV[o + 1 .. o + 8] (rules alike share
-- them). KEYS: the rules' state keys, multi-check after multi-check. No rule reads a
-- block (Rust sends those on their own).
--
-- Reply: { now, then per multi-check: its status, then 4 per rule: accepted (1/0), f1, f2,
-- f3 }. Status 1: every enforced rule accepted, and the accepted rules committed (a
-- shadow rule only when it accepts); 0: refused, nothing written; 2: failed (a key of
-- another type, a state that does not parse), its error in its first rule's first place,
-- nothing written (every read comes before the first write); 3: neither decided nor
-- written, because deciding it would leave the sliding window log's O(1) path (see
-- sliding_window_log_single.lua), nor is any later multi-check that shares a key with it
-- (Rust sends them on their own afterwards, in order). READONLY and MASTERDOWN fail the
-- whole call, as batch_main.lua's.
local now = read_now(ARGV[1])
local m = ARGV[3] + 0
local deferred = {}
-- Alone, a multi-check reads what it needs.
local bounded = m > 1

local function rule_at(o)
  return {
    alg = ARGV[o + 1],
    L = tonumber(ARGV[o + 2]),
    W = tonumber(ARGV[o + 3]),
    B = tonumber(ARGV[o + 4]),
    T = tonumber(ARGV[o + 5]),
    c = tonumber(ARGV[o + 6]),
    md = tonumber(ARGV[o + 7]),
    blk = tonumber(ARGV[o + 8]),
  }
end

-- Multi-check of the n rules whose keys are KEYS[k0 + 1 .. k0 + n] and whose offsets are
-- ARGV[3 + m + k0 + 1 ..]: its status, then each rule's verdict and fields.
local function decide(k0, n, roles)
  for i = 1, n do
    if deferred[KEYS[k0 + i]] then return 3 end
  end
  local states, ps, oks = {}, {}, {}
  local all = true
  for i = 1, n do
    local p = rule_at(ARGV[3 + m + k0 + i] + 0)
    local a = ALG[p.alg]
    if not a then error('tollgate: this script does not handle algorithm ' .. tostring(p.alg)) end
    local s = a.read(KEYS[k0 + i], p, now, bounded)
    if s == false then return 3 end
    s = s or a.default()
    local ok = a.decide(s, p, now)
    if not ok and string.byte(roles, i) ~= 115 then all = false end -- 115: 's', a shadow rule
    states[i], ps[i], oks[i] = s, p, ok
  end
  local fields = {}
  for i = 1, n do
    local f1, f2, f3 = ALG[ps[i].alg].fields(states[i])
    fields[4 * i - 3], fields[4 * i - 2], fields[4 * i - 1], fields[4 * i] = oks[i] and 1 or 0, f1, f2, f3
  end
  if all then
    for i = 1, n do
      if ps[i].c > 0 and oks[i] then ALG[ps[i].alg].commit(KEYS[k0 + i], states[i], ps[i], now) end
    end
  end
  return all and 1 or 0, fields
end

local out = { now }
local k0 = 0
for j = 1, m do
  local desc = ARGV[3 + j]
  local n = tonumber(string.match(desc, '^%d+'))
  local roles = string.sub(desc, #tostring(n) + 1)
  local at = #out + 1
  local ok, status, fields = pcall(decide, k0, n, roles)
  if not ok then
    local e = type(status) == 'table' and status.err or tostring(status)
    if string.sub(e, 1, 8) == 'READONLY' or string.sub(e, 1, 10) == 'MASTERDOWN' then
      return redis.error_reply(e)
    end
    out[at], out[at + 1] = 2, e
    for i = 2, 4 * n do out[at + i] = 0 end
  elseif status == 3 then
    -- Every key of it waits with it: a later multi-check on any of them goes after it.
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
