-- Prologue of the single-rule and batch scripts (scripts/*_single.lua): `now` in µs since
-- the epoch, from ARGV[1], or the server's TIME when ARGV[1] is '' (as lib.lua's
-- read_now); `commit`: mode 'c', decide and commit (else 'p', decide only).
local now
if ARGV[1] ~= '' then
  now = ARGV[1] + 0
else
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local commit = ARGV[2] == 'c'
