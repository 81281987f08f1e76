-- Token bucket (src/algorithm/token_bucket.rs). State 'level:last:keep', the level in µs
-- of refill (tokens × T) as of the latest commit, at `last`; `keep`: until when (µs) the
-- key must live, the latest expiry any write asked for (a key shared by quotas of
-- different periods, tiers, keeps the longest one's state), so that a write needs no
-- PTTL. Values of older versions ('level:last') have no `keep`: their TTL is read.
ALG.tb = {}

local function tb_level_at(s, capacity, now)
  return min(s[1] + max(now - s[2], 0), capacity)
end

function ALG.tb.read(key)
  return load(key)
end

function ALG.tb.default()
  return { 0, 0, fresh = true }
end

-- In debt (charged past empty, TokenBucket::charge): empty, `last` in the future.
local function tb_in_debt(s, now)
  return s[1] == 0 and s[2] > now
end

-- accept iff c <= B, the level holds c·T, and the bucket is not in debt
function ALG.tb.decide(s, p, now)
  return p.c <= p.B and tb_level_at(s, p.B * p.T, now) >= p.c * p.T and not tb_in_debt(s, now)
end

function ALG.tb.fields(s)
  return s[1], s[2], 0
end

-- Writes the state, living until its own expiry or the later `keep` the key has (`s[3]`,
-- or from PTTL for a value without it); a key that did not exist has none.
local function tb_put(key, s, level, last, capacity, now)
  local expires = last + (capacity - min(level, capacity))
  if expires <= now then
    redis.call('DEL', key)
    return
  end
  local keep = expires
  if not s.fresh then
    -- PTTL's whole ms less the one ttl_ms adds: the TTL it had, not one ms more.
    local held = s[3] or now + (redis.call('PTTL', key) - 1) * 1000
    keep = max(keep, held)
  end
  redis.call('SET', key, fmt(level) .. ':' .. fmt(last) .. ':' .. fmt(keep), 'PX', fmt(ttl_ms(keep, now)))
end

function ALG.tb.commit(key, s, p, now)
  local capacity = p.B * p.T
  local level = tb_level_at(s, capacity, now) - p.c * p.T
  tb_put(key, s, level, max(s[2], now), capacity, now)
end

-- As far ahead as GCRA's TAT: `last` plus the time to refill to full (TokenBucket::ahead).
function ALG.tb.room(s, p, now)
  local capacity = p.B * p.T
  local level = 0
  if not tb_in_debt(s, now) then level = tb_level_at(s, capacity, now) end
  local ahead = max(s[2], now) + (capacity - level)
  return floordiv(max(now + MAX_DEBT - ahead, 0), p.T)
end

-- Takes c tokens whatever the level (a charge): past empty, `last` moves forward by the
-- missing refill time (TokenBucket::charge).
function ALG.tb.charge(key, s, p, now)
  local capacity = p.B * p.T
  local need = p.c * p.T
  local level = 0
  if not tb_in_debt(s, now) then level = tb_level_at(s, capacity, now) end
  local last = max(s[2], now)
  if level >= need then
    level = level - need
  else
    last = last + (need - level)
    level = 0
  end
  tb_put(key, s, level, last, capacity, now)
end

-- p.at: when the commit was made (token_bucket.rs): give back what it still holds back,
-- its c·T less the time from it to the latest commit (`last`), added to the level as of
-- then.
function ALG.tb.refund(key, s, p, now)
  local capacity = p.B * p.T
  local tokens = p.c * p.T
  local level = min(s[1] + min(tokens, max(p.at + tokens - s[2], 0)), capacity)
  tb_put(key, s, level, s[2], capacity, now)
end
