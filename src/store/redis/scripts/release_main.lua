-- Main of the release script (group commit of releases, src/store/redis/release.rs; issue
-- 42): refund.lua's arguments (lib.lua's 8 per rule, then `at`, the permit's id) for
-- permits only, straight-line after single_now.lua: each permit named is given back if its
-- key's hash still holds it, and its hold time recorded among the key's 8 newest, exactly
-- as concurrency.lua's refund_key (one HMGET for the permit and the hold times, HDEL, HSET).
-- Returns now.
for i = 1, #KEYS do
  local b = 2 + (i - 1) * 9
  if ARGV[b + 1] ~= 'conc' then
    return redis.error_reply('tollgate: the release script got a rule of ' .. tostring(ARGV[b + 1]))
  end
  local key, f = KEYS[i], string.format('%d', ARGV[b + 9] + 0)
  local v = redis.call('HMGET', key, f, 'h')
  if v[1] then
    redis.call('HDEL', key, f)
    local held = now - tonumber(string.match(v[1], '^%d+:%d+:(%d+)'))
    if held < 1 then held = 1 end
    local parts = {}
    if v[2] then
      for part in string.gmatch(v[2], '[^,]+') do parts[#parts + 1] = part end
    end
    parts[#parts + 1] = string.format('%d', held)
    local first = #parts - 7
    if first < 1 then first = 1 end
    redis.call('HSET', key, 'h', table.concat(parts, ',', first))
  end
end
return now
