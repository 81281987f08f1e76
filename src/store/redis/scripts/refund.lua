-- Main of the refund script: gives back, per key, the c units of the commit that recorded
-- them at `at` (State::refund): exactly those, and nothing once they have left the window.
-- A key that is absent is the "never seen" state, where a refund changes nothing: it is
-- not created. Returns now.
local now = read_now(ARGV[1])
for i = 1, #KEYS do
  local p = params(i, 9)
  local a = ALG[p.alg]
  if not a then
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(p.alg))
  end
  if a.refund_key then
    a.refund_key(KEYS[i], p, now)
  else
    local s = a.read(KEYS[i], p, now)
    if s then a.refund(KEYS[i], s, p, now) end
  end
end
return now
