-- Main of the renew script (issue 42): each permit named (KEYS[i] its key's hash, `at` its
-- id, W its hold limit) lives a hold limit from now, if the hash still holds it.
-- Returns now.
local now = read_now(ARGV[1])
for i = 1, #KEYS do
  local p = params(i, 9)
  local a = ALG[p.alg]
  if not a or not a.renew_key then
    return redis.error_reply('tollgate: only permits are renewed, not ' .. tostring(p.alg))
  end
  a.renew_key(KEYS[i], p, now)
end
return now
