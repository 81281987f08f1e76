-- GCRA for a check of one rule, the common case, and the token bucket as its twin: the
-- same arguments (lib.lua), reply (check.lua) and writes as the generic check script
-- built with gcra.lua, straight-line. The generic script builds its function table, a
-- parameter table and its loop on every call, which is most of its cost inside Redis:
-- this one takes about half the CPU (see docs/performance.md). Rust checks its verdict
-- against src/algorithm/gcra.rs as for every script.
-- `now` and `commit` come from single_now.lua, concatenated in front of this file;
-- `tat_decide(key, o, tag, name)` decides the rule whose 8 arguments are
-- ARGV[o + 1 .. o + 8] (lib.lua's order) on `key`, whose algorithm tag must be `tag`,
-- commits when it accepts in mode 'c', and returns the verdict (1/0) and the three state
-- fields it read. gcra_single.lua or token_bucket_single.lua (`decide`) follows, then
-- single_main.lua or batch_main.lua.
local function tat_decide(key, o, tag, name)
  -- ARGV[o + 4 .. o + 7]: burst B, emission interval T (µs), cost c, and for a quota
  -- slice's check `ahead + after·2^26` (0 for a request's): how far past the burst it
  -- reaches, and how long after now its first slot comes at the earliest (µs).
  local p = rule(o, tag, name, 4, 5, 6, 7)
  local B, T, c, ahead = p[1], p[2], p[3], p[4]
  local after = 0
  if ahead > 0 then
    after = math.floor(ahead / 67108864)
    ahead = ahead - after * 67108864
  end
  -- State: the TAT, and `left` when this script set the key's expiry (the key expires
  -- `left` µs after the TAT), as doubles (`struct.pack('d')`: exact below 2^53, and no
  -- number printed or parsed, which was a fifth of this script's cost in Redis), or none.
  local tat, left = 0, nil
  local v = redis.call('GET', key)
  if v then
    tat, left = tat_state(v)
  end
  local base = tat > now + after and tat or now + after
  -- with TAT' = max(TAT, now): accept iff c <= B and TAT' - now + c·T <= B·T (a slice's
  -- reaches `ahead` further)
  local reach = B * T + ahead
  local ok = c * T <= reach and base - now + c * T <= reach
  if ok and commit then
    -- The TAT this commit leaves: its identity for a refund (Rust computes it too).
    local new = base + c * T
    -- The key must live until `new`. When the expiry this script gave it already reaches
    -- that far, the TTL is kept (`SET … KEEPTTL` costs Redis about 0.7 µs less than
    -- `SET … PX`); else it is set to `new` plus the state's remaining life, at most 10 s:
    -- a key outlives its state by at most that, and a busy key's TTL is set again only
    -- once its TAT has moved on by as much.
    local expires = left and tat + left
    if server_time and expires and new <= expires then
      redis.call('SET', key, struct.pack('dd', new, expires - new), 'KEEPTTL')
    else
      local slack = new - now
      if slack > 10000000 then slack = 10000000 end
      redis.call('SET', key, struct.pack('dd', new, slack), 'PX', px(new + slack))
    end
  end
  local r = ok and 1 or 0
  return r, tat, 0, 0
end
