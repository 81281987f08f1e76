-- Fixed window counter (src/algorithm/fixed_window.rs). State 'window:count:born' (born:
-- the earliest time a commit into the state recorded; a refund of a commit made before it
-- gives nothing back).
ALG.fw = {}

-- The window of `now`, or the stored one when it is the next (the clock stepped back across
-- its start); only the next: a window of another period (a tier) is not comparable.
local function fw_window(s, p, now)
  local w = floordiv(now, p.W)
  if s[1] == w + 1 then return s[1] end
  return w
end

local function fw_count_at(s, w)
  if s[1] == w then return s[2] end
  return 0
end

function ALG.fw.read(key)
  return load(key)
end

function ALG.fw.default()
  return { 0, 0 }
end

-- accept iff count + c <= L
function ALG.fw.decide(s, p, now)
  return fw_count_at(s, fw_window(s, p, now)) + p.c <= p.L
end

function ALG.fw.fields(s)
  return s[1], s[2], 0
end

function ALG.fw.room(s, p, now)
  return max(MAX_DEBT - fw_count_at(s, fw_window(s, p, now)), 0)
end

function ALG.fw.commit(key, s, p, now)
  local w = fw_window(s, p, now)
  local count = fw_count_at(s, w) + p.c
  -- born: the earliest time a commit into this state recorded (`at`: now, or the stored
  -- window's start when the clock stepped back before it)
  local at = max(now, w * p.W)
  local born = at
  if s[3] then born = min(s[3], at) end
  put(key, fmt(w) .. ':' .. fmt(count) .. ':' .. fmt(born), (w + 1) * p.W, now)
end

-- the commit's units, while its window (that of `at`) is the stored one, and the state was
-- written by then (else a reset forgot it)
function ALG.fw.refund(key, s, p, now)
  if s[1] ~= floordiv(p.at, p.W) then return end
  if s[3] and p.at < s[3] then return end
  local count = max(s[2] - p.c, 0)
  put_keep(key, fmt(s[1]) .. ':' .. fmt(count) .. ':' .. fmt(s[3] or p.at), (s[1] + 1) * p.W, now)
end
