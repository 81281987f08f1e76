-- GCRA (src/algorithm/gcra.rs), and the token bucket as its twin (token_bucket.rs): the
-- same code under the tag 'tb', whose keys are its own. State: the theoretical arrival
-- time (µs), and, when gcra_single.lua wrote it, how long after the TAT the key expires
-- (this script's writes leave it out), packed as doubles (see tat_state, floordiv.lua).
ALG.gcra = {}

function ALG.gcra.read(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  return { (tat_state(v)) }
end

function ALG.gcra.default()
  return { 0 }
end

-- A quota slice's reach past the burst and the least distance of its first slot from now
-- (lib.lua: the 7th argument is `ahead + after·2^26` for GCRA; 0 for a request's check).
local function slice_args(p)
  local after = math.floor(p.md / 67108864)
  return p.md - after * 67108864, after
end

-- with TAT' = max(TAT, now + after): accept iff c <= B and TAT' - now + c·T <= B·T + ahead
function ALG.gcra.decide(s, p, now)
  local ahead, after = slice_args(p)
  local used = max(s[1], now + after) - now
  local reach = p.B * p.T + ahead
  return p.c * p.T <= reach and used + p.c * p.T <= reach
end

function ALG.gcra.fields(s)
  return s[1], 0, 0
end

function ALG.gcra.room(s, p, now)
  return floordiv(max(now + MAX_DEBT - max(s[1], now), 0), p.T)
end

-- An accepted request, or a charge (past the burst, the TAT goes into debt). The TAT it
-- leaves is the commit's identity for a refund (Rust computes it from the reply).
function ALG.gcra.commit(key, s, p, now)
  local _, after = slice_args(p)
  local tat = max(s[1], now + after) + p.c * p.T
  put(key, struct.pack('d', tat), tat, now)
end

-- p.at: the TAT the commit left. All or nothing (Gcra::refund): when no commit was made
-- since (the TAT is still p.at), its c·T comes back, never before now; else nothing.
function ALG.gcra.refund(key, s, p, now)
  if s[1] ~= p.at then return end
  local tat = max(p.at - p.c * p.T, now)
  put_keep(key, struct.pack('d', tat), tat, now)
end

ALG.tb = ALG.gcra
