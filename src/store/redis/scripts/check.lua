-- Main of the check scripts: decides every key, commits only if every key accepts (and
-- the mode is 'c'), and returns what it read so that Rust decides with the same pure
-- functions: { now, all accepted (1/0), then per key: accepted (1/0), f1, f2, f3 }.
local now = read_now(ARGV[1])
local commit = ARGV[2] == 'c'
local out = { now, 1 }
local states, ps = {}, {}
local all = true
for i = 1, #KEYS do
  local p = params(i, 7)
  local a = ALG[p.alg]
  if not a then
    return redis.error_reply('tollgate: this script does not handle algorithm ' .. tostring(p.alg))
  end
  local s = a.read(KEYS[i], p, now) or a.default()
  local ok = a.decide(s, p, now)
  if not ok then all = false end
  local f1, f2, f3 = a.fields(s)
  out[#out + 1] = ok and 1 or 0
  out[#out + 1] = f1
  out[#out + 1] = f2
  out[#out + 1] = f3
  states[i], ps[i] = s, p
end
if all and commit then
  local written = {}
  for i = 1, #KEYS do
    local a, s = ALG[ps[i].alg], states[i]
    -- Rust refuses a check list naming one state twice (store::distinct); should a key
    -- come twice anyway, commit on top of the first commit rather than over it.
    if written[KEYS[i]] then s = a.read(KEYS[i], ps[i], now) or a.default() end
    a.commit(KEYS[i], s, ps[i], now)
    written[KEYS[i]] = true
  end
end
out[2] = all and 1 or 0
return out
