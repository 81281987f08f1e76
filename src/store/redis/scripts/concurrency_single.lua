-- Concurrency (issue 42) for a check of one rule: the same arguments (lib.lua), reply
-- (check.lua) and writes as the generic check script built with concurrency.lua,
-- straight-line, so that entries are group-committed as other single-rule checks are.
-- `now` and `commit` come from single_now.lua; `decide(key, o)` decides the rule whose 8
-- arguments are ARGV[o + 1 .. o + 8] on `key`, commits when it accepts in mode 'c', and
-- returns the verdict (1/0), the permits held, the median recent hold time (0: none) and
-- the id a commit gives now.
local function decide(key, o)
  -- ARGV[o + 2], ARGV[o + 3], ARGV[o + 6]: n, the hold limit W (µs), cost c.
  local p = rule(o, 'conc', 'concurrency', 2, 3, 6)
  local L, W, c = p[1], p[2], p[3]
  local all = redis.call('HGETALL', key)
  local used, last, holds, lapsed = 0, 0, {}, {}
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if f == 'last' then
      last = v + 0
    elseif f == 'h' then
      for part in string.gmatch(v, '[^,]+') do
        if part + 0 > 0 then holds[#holds + 1] = part + 0 end
      end
    else
      local units, lapse = string.match(v, '^(%d+):(%d+)')
      if lapse + 0 <= now then
        lapsed[#lapsed + 1] = f
      else
        used = used + units
      end
    end
  end
  table.sort(holds)
  local median = 0
  if #holds > 0 then median = holds[floordiv(#holds, 2) + 1] end
  local want = c
  if want < 1 then want = 1 end
  local ok = used + want <= L
  if ok and commit then
    local id = last + 1
    if now > id then id = now end
    if #lapsed > 0 then redis.call('HDEL', key, unpack(lapsed)) end
    redis.call('HSET', key, string.format('%d', id), string.format('%d:%d:%d', c, now + W, now),
      'last', string.format('%d', id))
    local left = redis.call('PTTL', key)
    local want_ttl = floordiv(2 * W + 999, 1000) + 1
    if left < want_ttl then redis.call('PEXPIRE', key, string.format('%d', want_ttl)) end
  end
  return ok and 1 or 0, used, median, last + 1
end
