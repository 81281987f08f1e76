-- Main of the check scripts: decides every rule, commits only if every enforced rule
-- accepts (and the mode is 'c'), and returns what it read so that Rust decides with the
-- same pure functions: { now, every enforced rule accepted (1/0), then per rule: accepted
-- (1/0), f1, f2, f3, the end of its block (0: none) }. A rule of cost 0 is a probe (a
-- charged rule's admission): decided, never written.
--
-- Roles (Rule::shadow): in modes 'c' and 'p', ARGV[2] may go on with one letter per rule,
-- 'e' enforced or 's' shadow ('c' alone: all enforced). A shadow rule is decided and reported
-- but never refuses the call, and is committed only when it and every enforced rule
-- accept.
--
-- Mode 'f' (charges reported after a response, Rule::charged): every rule takes its cost
-- whatever it decides (State::charge: the key may go into debt); no block is started.
--
-- Blocks (Rule::block_for, src/algorithm/mod.rs `blocking`): a rule whose block has not
-- ended refuses without deciding (its block is read when its block argument is not 0:
-- -1 for a rule blocked only by hand, Rule::blockable); a rejection by the rule's
-- algorithm starts a block, the one write a rejection makes (a rejection during a block
-- does not extend it).
local now = read_now(ARGV[1])
local n = (#ARGV - 2) / 8
local mode = string.sub(ARGV[2], 1, 1)
local roles = string.sub(ARGV[2], 2)
-- Mode 'b' (Limiter::block): each rule's block (its key after the state keys) ends its
-- block argument from now; -1 lifts it. Nothing else is read or written.
if mode == 'b' then
  for i = 1, n do
    local p = params(i, 8)
    if p.blk > 0 then
      redis.call('SET', KEYS[n + i], fmt(now + p.blk), 'PX', fmt(ttl_ms(now + p.blk, now)))
    else
      redis.call('DEL', KEYS[n + i])
    end
  end
  return { now, 1 }
end
local commit = mode == 'c'
local force = mode == 'f'
local out = { now, 1 }
local states, ps, oks = {}, {}, {}
local all = true
local blocks = 0
for i = 1, n do
  local p = params(i, 8)
  local a = ALG[p.alg]
  if not a then
    return redis.error_reply('tollgate: this script does not handle algorithm ' .. tostring(p.alg))
  end
  local s = a.read(KEYS[i], p, now) or a.default()
  p.blocked = 0
  if p.blk ~= 0 then
    blocks = blocks + 1
    p.bkey = KEYS[n + blocks]
    p.blocked = tonumber(redis.call('GET', p.bkey)) or 0
  end
  local ok = p.blocked <= now and a.decide(s, p, now)
  if not ok and string.byte(roles, i) ~= 115 then all = false end -- 115: 's', a shadow rule
  local f1, f2, f3 = a.fields(s)
  out[#out + 1] = ok and 1 or 0
  out[#out + 1] = f1
  out[#out + 1] = f2
  out[#out + 1] = f3
  out[#out + 1] = p.blocked
  states[i], ps[i], oks[i] = s, p, ok
end
if commit then
  for i = 1, n do
    local p = ps[i]
    -- A cost the quota can never admit is refused without starting a block (as Rust's
    -- `blocking`: such a rejection has no retry).
    if p.blk > 0 and not oks[i] and p.blocked <= now and p.c <= capacity(p) then
      local ends = now + p.blk
      redis.call('SET', p.bkey, fmt(ends), 'PX', fmt(ttl_ms(ends, now)))
    end
  end
end
if (all and commit) or force then
  local written = {}
  for i = 1, n do
    local a, s = ALG[ps[i].alg], states[i]
    -- Rust refuses a check list naming one state twice (store::distinct); should a key
    -- come twice anyway, commit on top of the first commit rather than over it.
    if written[KEYS[i]] then s = a.read(KEYS[i], ps[i], now) or a.default() end
    -- A charge takes at most what keeps the debt within MAX_DEBT (State::charge).
    if force then ps[i].c = min(ps[i].c, a.room(s, ps[i], now)) end
    if ps[i].c > 0 and (force or oks[i]) then
      if force and a.charge then a.charge(KEYS[i], s, ps[i], now) else a.commit(KEYS[i], s, ps[i], now) end
      written[KEYS[i]] = true
    end
  end
end
out[2] = all and 1 or 0
return out
