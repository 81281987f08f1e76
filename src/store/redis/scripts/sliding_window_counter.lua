-- Sliding window counter (src/algorithm/sliding_window_counter.rs). State
-- 'window:prev:curr:born' (born: the earliest time a commit into the state recorded; a
-- refund of a commit made before it gives nothing back).
ALG.swc = {}

local function swc_counts_at(s, w)
  if s[1] == w then
    return s[2], s[3]
  elseif s[1] + 1 == w then
    return s[3], 0
  end
  return 0, 0
end

function ALG.swc.read(key)
  return load(key)
end

function ALG.swc.default()
  return { 0, 0, 0 }
end

-- The window of `now`, or the stored one when it is the next (the clock stepped back across
-- its start); only the next: a window of another period (a tier) is not comparable.
local function swc_window(s, p, now)
  local w = floordiv(now, p.W)
  if s[1] == w + 1 then return s[1] end
  return w
end

-- accept iff prev * (W - e) / W + curr + c <= L, in doubles, in exactly this order
function ALG.swc.decide(s, p, now)
  local w = swc_window(s, p, now)
  local e = max(now - w * p.W, 0)
  local prev, curr = swc_counts_at(s, w)
  local estimate = prev * (p.W - e) / p.W + curr
  return estimate + p.c <= p.L
end

function ALG.swc.fields(s)
  return s[1], s[2], s[3]
end

function ALG.swc.room(s, p, now)
  local _, curr = swc_counts_at(s, swc_window(s, p, now))
  return max(MAX_DEBT - curr, 0)
end

function ALG.swc.commit(key, s, p, now)
  local w = swc_window(s, p, now)
  local prev, curr = swc_counts_at(s, w)
  local at = max(now, w * p.W)
  local born = at
  if s[4] then born = min(s[4], at) end
  put(key, fmt(w) .. ':' .. fmt(prev) .. ':' .. fmt(curr + p.c) .. ':' .. fmt(born), (w + 2) * p.W, now)
end

-- the commit's units: from curr while its window (that of `at`) is the current one, from
-- prev once the state rolled over to the next, else nothing
function ALG.swc.refund(key, s, p, now)
  local w = floordiv(p.at, p.W)
  if s[4] and p.at < s[4] then return end
  local prev, curr = s[2], s[3]
  if s[1] == w then
    curr = max(curr - p.c, 0)
  elseif s[1] == w + 1 then
    prev = max(prev - p.c, 0)
  else
    return
  end
  put_keep(key, fmt(s[1]) .. ':' .. fmt(prev) .. ':' .. fmt(curr) .. ':' .. fmt(s[4] or p.at), (s[1] + 2) * p.W, now)
end
