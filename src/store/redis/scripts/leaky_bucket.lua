-- Leaky bucket as a shaper (src/algorithm/leaky_bucket.rs). State 'next', the next free
-- slot.
ALG.lb = {}

function ALG.lb.read(key)
  return load(key)
end

function ALG.lb.default()
  return { 0 }
end

-- accept iff c <= B + 1, the last unit waits at most B·T, and the delay <= max delay
function ALG.lb.decide(s, p, now)
  local delay = max(s[1], now) - now
  return p.c <= p.B + 1 and delay + max(p.c - 1, 0) * p.T <= p.B * p.T and delay <= p.md
end

function ALG.lb.fields(s)
  return s[1], 0, 0
end

function ALG.lb.room(s, p, now)
  return floordiv(max(now + MAX_DEBT - max(s[1], now), 0), p.T)
end

function ALG.lb.commit(key, s, p, now)
  local next = max(s[1], now) + p.c * p.T
  put(key, fmt(next), next, now)
end

-- the commit's slots (its first at `at`), only while they are the last taken
function ALG.lb.refund(key, s, p, now)
  if s[1] ~= p.at + p.c * p.T then return end
  local next = max(p.at, now)
  put_keep(key, fmt(next), next, now)
end
