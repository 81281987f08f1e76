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
