-- GCRA (src/algorithm/gcra.rs). State 'tat', the theoretical arrival time.
ALG.gcra = {}

function ALG.gcra.read(key)
  return load(key)
end

function ALG.gcra.default()
  return { 0 }
end

-- with TAT' = max(TAT, now): accept iff c <= B and TAT' - now + c·T <= B·T
function ALG.gcra.decide(s, p, now)
  local used = max(s[1], now) - now
  return p.c <= p.B and used + p.c * p.T <= p.B * p.T
end

function ALG.gcra.fields(s)
  return s[1], 0, 0
end

function ALG.gcra.commit(key, s, p, now)
  local tat = max(s[1], now) + p.c * p.T
  put(key, fmt(tat), tat, now)
end

-- p.at: when the commit was made (gcra.rs): give back what it still holds back, its
-- c·T less the time since.
function ALG.gcra.refund(key, s, p, now)
  local cells = p.c * p.T
  local tat = max(s[1] - min(cells, max(p.at + cells - now, 0)), now)
  put_keep(key, fmt(tat), tat, now)
end
