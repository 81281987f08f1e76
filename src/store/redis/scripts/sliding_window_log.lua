-- Sliding window log (src/algorithm/sliding_window_log.rs). A sorted set, run-length
-- encoded as the Rust log: one member per timestamp that holds accepted units,
-- '<ts>:<units>' scored by ts, so a request of any cost is one member and O(1) work; and
-- the member '#', scored -1 - (the units of every other member), the log's running total.
-- Timestamps are >= 0 and '#' scores below -1: score ranges from 0 up never meet it.
ALG.swl = {}

local function swl_units(member)
  return tonumber(string.match(member, ':(%d+)$'))
end

local function swl_total(key)
  local t = redis.call('ZSCORE', key, '#')
  if not t then return 0 end
  return -1 - tonumber(t)
end

local function swl_set_total(key, total)
  if total <= 0 then
    redis.call('DEL', key)
  else
    redis.call('ZADD', key, fmt(-1 - total), '#')
  end
end

-- How many of the oldest members one read fetches besides '#': the expired prefix is
-- usually 0 or 1 member long (every commit drops it), so one read finds it and the oldest
-- live member.
local SWL_HEAD = 8

-- Reads the log's summary (sliding_window_log::Summary): units in (now - W, now]; when
-- c more fit, the oldest timestamp in the window, else that of the k-th oldest unit where
-- k is how many must leave first; and the newest timestamp. Then, for the commit: the
-- total, and the expired prefix's units and members. Reads only.
function ALG.swl.read(key, p, now)
  -- '#' sorts first (its score is below every timestamp), then the oldest entries.
  local head = redis.call('ZRANGE', key, 0, SWL_HEAD, 'WITHSCORES')
  if #head == 0 then return nil end
  local total = -1 - tonumber(head[2])
  local low = now - p.W
  local expired, gone, oldest = 0, 0, 0
  for i = 3, #head, 2 do
    local ts = tonumber(head[i + 1])
    if ts > low then
      oldest = ts
      break
    end
    expired = expired + swl_units(head[i])
    gone = gone + 1
  end
  if oldest == 0 and #head == 2 + 2 * SWL_HEAD then
    -- A longer expired prefix (the key was idle, or kept rejecting): count all of it.
    local all = redis.call('ZRANGEBYSCORE', key, 0, fmt(low))
    expired, gone = 0, #all
    for i = 1, #all do expired = expired + swl_units(all[i]) end
    local first = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(low), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if first[2] then oldest = tonumber(first[2]) end
  end
  local in_window = total - expired
  local kth, newest = 0, 0
  if in_window > 0 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    newest = tonumber(last[2])
    local k = 1
    if in_window + p.c > p.L then
      k = 0
      if p.c <= p.L then k = in_window + p.c - p.L end
    end
    if k == 1 then
      kth = oldest
    elseif k > 1 then
      -- The k-th oldest unit is within the first k members: each holds at least one.
      local r = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(low), '+inf', 'WITHSCORES', 'LIMIT', 0, fmt(k))
      local seen = 0
      for i = 1, #r, 2 do
        seen = seen + swl_units(r[i])
        if seen >= k then
          kth = tonumber(r[i + 1])
          break
        end
      end
    end
  end
  return { in_window, kth, newest, total, expired, gone }
end

function ALG.swl.default()
  return { 0, 0, 0, 0, 0, 0, fresh = true }
end

function ALG.swl.room(s, p, now)
  return max(MAX_DEBT - s[1], 0)
end

-- accept iff units in the window + c <= L
function ALG.swl.decide(s, p, now)
  return s[1] + p.c <= p.L
end

function ALG.swl.fields(s)
  return s[1], s[2], s[3]
end

-- Drops the entries <= now - W (as read), then records c units at max(now, newest):
-- added to the newest member when the clock stepped back (or two requests share a µs), as
-- the Rust log.
function ALG.swl.commit(key, s, p, now)
  local total = s[4]
  if s[6] > 0 then
    redis.call('ZREMRANGEBYSCORE', key, 0, fmt(now - p.W))
    total = total - s[5]
  end
  local ts = max(now, s[3])
  local units = p.c
  if ts == s[3] then
    local same = redis.call('ZRANGEBYSCORE', key, fmt(ts), fmt(ts))
    if same[1] then
      units = units + swl_units(same[1])
      redis.call('ZREM', key, same[1])
    end
  end
  redis.call('ZADD', key, fmt(ts), fmt(ts) .. ':' .. fmt(units))
  swl_set_total(key, total + p.c)
  -- A key that did not exist has no longer TTL to keep: no PTTL.
  local ms = s.fresh and ttl_ms(ts + p.W, now) or ttl_keep(key, ts + p.W, now)
  redis.call('PEXPIRE', key, fmt(ms))
end

-- Gives back the c units of the commit recorded at `at`, from its own member, while it
-- is still in the window: never units of other requests.
function ALG.swl.refund_key(key, p, now)
  if p.at + p.W <= now then return end
  local same = redis.call('ZRANGEBYSCORE', key, fmt(p.at), fmt(p.at))
  if not same[1] then return end
  local units = swl_units(same[1])
  local take = min(units, p.c)
  redis.call('ZREM', key, same[1])
  if units > take then
    redis.call('ZADD', key, fmt(p.at), fmt(p.at) .. ':' .. fmt(units - take))
  end
  swl_set_total(key, swl_total(key) - take)
end
