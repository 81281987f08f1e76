-- Token bucket for a check of one rule: the same arguments (lib.lua), reply (check.lua)
-- and writes as the generic check script built with token_bucket.lua, straight-line, as
-- gcra_single.lua. Rust checks its verdict against src/algorithm/token_bucket.rs as for
-- every script.
-- `now` and `commit` come from single_now.lua, concatenated in front of this file;
-- `decide(key, o)` decides the rule whose 8 arguments are ARGV[o + 1 .. o + 8] (lib.lua's
-- order) on `key`, commits when it accepts in mode 'c', and returns the verdict (1/0) and
-- the three state fields it read. single_main.lua or batch_main.lua follows.
local function decide(key, o)
  -- ARGV[o + 4 .. o + 6]: burst B, emission interval T (µs), cost c.
  local p = rule(o, 'tb', 'token bucket', 4, 5, 6)
  local B, T, c = p[1], p[2], p[3]
  -- State 'level:last:keep' (level in µs of refill; `keep`: until when the key must live,
  -- see token_bucket.lua), or 0:0 when absent. A value of an older version has no `keep`.
  local sl, st, sk = 0, 0, ''
  local v = redis.call('GET', key)
  if v then
    sl, st, sk = string.match(v, '^([^:]+):([^:]+):?([^:]*)$')
    sl, st = sl + 0, st + 0
  end
  -- level = min(level + max(now - last, 0), B·T)
  local capacity = B * T
  local level = now - st
  if level < 0 then level = 0 end
  level = sl + level
  if level >= capacity then level = capacity end
  -- accept iff c <= B and the level holds c·T
  local cost = c * T
  local ok = c <= B and level >= cost
  if ok and commit then
    level = level - cost
    local last = st > now and st or now
    local full = level < capacity and level or capacity
    local expires = last + (capacity - full)
    if expires <= now then
      redis.call('DEL', key)
    else
      -- token_bucket.lua's tb_put: a later `keep` the key has (another quota's state) is
      -- kept, read from the value (or, from a value of an older version, from PTTL).
      local held
      if v then
        if sk ~= '' then
          held = sk + 0
        else
          held = now + (redis.call('PTTL', key) - 1) * 1000
        end
      end
      if server_time and held and expires <= held then
        -- The key already lives long enough: its TTL is kept (`KEEPTTL` costs Redis
        -- less than `PX`).
        redis.call('SET', key, string.format('%d:%d:%d', level, last, held), 'KEEPTTL')
      else
        -- Else it lives until `expires` plus the state's remaining life, at most 10 s: a
        -- key outlives its state by at most that, and a busy key's TTL is set again only
        -- once its expiry has moved on by as much.
        local slack = expires - now
        if slack > 10000000 then slack = 10000000 end
        local keep = expires + slack
        redis.call('SET', key, string.format('%d:%d:%d', level, last, keep), 'PX', px(keep))
      end
    end
  end
  local r = ok and 1 or 0
  return r, sl, st, 0
end
