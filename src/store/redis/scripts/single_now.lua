-- Prologue of the single-rule and batch scripts (scripts/*_single.lua): `now` in µs since
-- the epoch, from ARGV[1], or the server's TIME when ARGV[1] is '' (as lib.lua's
-- read_now); `commit`: mode 'c', decide and commit (else 'p', decide only).
local now
-- On Redis's own time a key's TTL runs on the clock `now` comes from, and a write may keep
-- it (`KEEPTTL`); on a client's clock, which may step, every write sets it afresh.
local server_time = ARGV[1] == ''
if not server_time then
  now = ARGV[1] + 0
else
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local commit = ARGV[2] == 'c'

-- lib.lua's ttl_ms(expires, now) for `expires` after now: whole ms rounded up, plus one,
-- printed exactly (integers print exactly with %d).
local function px(expires)
  return string.format('%d', floordiv(expires - now + 999, 1000) + 1)
end

-- The numbers of the rule whose 8 arguments follow ARGV[o] (lib.lua's order), at
-- positions a, b, c (and d) among them, converted once per call (a batch's decisions
-- share their rule's arguments); the rule's algorithm tag must be `tag`.
local rules = {}
local function rule(o, tag, name, a, b, c, d)
  local p = rules[o]
  if not p then
    if ARGV[o + 1] ~= tag then
      error('tollgate: the ' .. name .. ' script got a rule of ' .. tostring(ARGV[o + 1]))
    end
    p = { ARGV[o + a] + 0, ARGV[o + b] + 0, ARGV[o + c] + 0, d and ARGV[o + d] + 0 }
    rules[o] = p
  end
  return p
end
