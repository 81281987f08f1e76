-- floor(a / b) for integers a >= 0, b >= 1, corrected for the rounding of a / b. First in
-- every script (src/store/redis/script.rs): the generic, refund and single-rule ones.
local function floordiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- A GCRA or token-bucket state (scripts gcra.lua and tat_single.lua): its TAT, and the
-- `left` tat_single.lua keeps beside it, packed as doubles (8 or 16 bytes). A value of
-- another shape, or a TAT that is no whole number of µs, is refused: a state that does not
-- parse fails its check.
local function tat_state(v)
  local tat, left
  if #v == 16 then
    tat, left = struct.unpack('dd', v)
  elseif #v == 8 then
    tat = struct.unpack('d', v)
  else
    error('tollgate: a GCRA state of ' .. #v .. ' bytes')
  end
  if not (tat >= 0 and tat <= 9007199254740992 and tat == math.floor(tat)) then
    error('tollgate: a GCRA state that is no time')
  end
  return tat, left
end
