-- GCRA (src/algorithm/gcra.rs). State 'tat:gap': the theoretical arrival time, and how long
-- before it the latest commit was made (it bounds refunds; a gap keeps the string short).
ALG.gcra = {}

function ALG.gcra.read(key)
  local s = load(key)
  if not s then return nil end
  return { s[1], s[1] - (s[2] or 0) }
end

local function gcra_put(key, put_fn, tat, last, now)
  put_fn(key, fmt(tat) .. ':' .. fmt(max(tat - last, 0)), tat, now)
end

function ALG.gcra.default()
  return { 0, 0 }
end

-- with TAT' = max(TAT, now): accept iff c <= B and TAT' - now + c·T <= B·T
function ALG.gcra.decide(s, p, now)
  local used = max(s[1], now) - now
  return p.c <= p.B and used + p.c * p.T <= p.B * p.T
end

function ALG.gcra.fields(s)
  return s[1], s[2], 0
end

function ALG.gcra.room(s, p, now)
  return floordiv(max(now + MAX_DEBT - max(s[1], now), 0), p.T)
end

function ALG.gcra.commit(key, s, p, now)
  local tat = max(s[1], now) + p.c * p.T
  gcra_put(key, put, tat, max(s[2], now), now)
end

-- p.at: when the commit was made (gcra.rs): give back what it still holds back, its c·T
-- less the time from it to the latest commit.
function ALG.gcra.refund(key, s, p, now)
  local cells = p.c * p.T
  local tat = max(s[1] - min(cells, max(p.at + cells - s[2], 0)), now)
  gcra_put(key, put_keep, tat, s[2], now)
end
