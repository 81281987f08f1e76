-- Sliding window log (src/algorithm/sliding_window_log.rs). A sorted set, run-length
-- encoded as the Rust log: one member per timestamp that holds accepted units,
-- '<ts>:<units>' scored by ts, so a request of any cost is one member and O(1) work; and
-- three marks scored below 0 (timestamps are >= 0: score ranges from 0 up never meet
-- them), which sort first, so that the one read of the head finds them:
--   '#' scored -1 - (the units of every other member), the log's running total;
--   '>' scored -1 - (the newest member's timestamp);
--   '~' scored -1 - (when the key's TTL ends, µs), kept only on the server's clock: the
--       key lives at least that long, so a commit that needs no longer sets no TTL.
-- A commit is ZRANGE (the marks and the head), one ZADD (its member and the marks) and,
-- now and then, PEXPIRE; with the expired prefix to drop, ZREMRANGEBYSCORE.
ALG.swl = {}

local function swl_units(member)
  return tonumber(string.match(member, ':(%d+)$'))
end

-- How many of the oldest members one read fetches besides the marks: the expired prefix
-- is usually 0 or 1 member long (every commit drops it), so one read finds it and the
-- oldest live member.
local SWL_HEAD = 8
local SWL_MARKS = 3

-- A key outlives its newest member's window by at most this (µs): its TTL is set again
-- only once a commit needs it to reach further.
local SWL_SLACK = 10000000

-- Reads the log's summary (sliding_window_log::Summary): units in (now - W, now]; when
-- c more fit, the oldest timestamp in the window, else that of the k-th oldest unit where
-- k is how many must leave first; and the newest timestamp. Then, for the commit: the
-- total, the expired prefix's units and members, the newest timestamp even when expired,
-- and the end of the key's TTL ('~', 0 when unknown). Reads only.
--
-- `bounded`: return false, having read only the head, rather than read further (a long
-- expired prefix, or a k-th unit past the head): a batch sends that decision on its own.
function ALG.swl.read(key, p, now, bounded)
  local head = redis.call('ZRANGE', key, 0, SWL_HEAD + SWL_MARKS - 1, 'WITHSCORES')
  if #head == 0 then return nil end
  local low = now - p.W
  local total, newest, expires = 0, nil, 0
  local expired, gone, oldest, first = 0, 0, 0, nil
  for i = 1, #head, 2 do
    local m, ts = head[i], tonumber(head[i + 1])
    if ts < 0 then
      if m == '#' then
        total = -1 - ts
      elseif m == '>' then
        newest = -1 - ts
      elseif m == '~' then
        expires = -1 - ts
      end
    elseif not first then
      if ts > low then
        oldest, first = ts, i
      else
        expired = expired + swl_units(m)
        gone = gone + 1
      end
    end
  end
  local full = #head == 2 * (SWL_HEAD + SWL_MARKS)
  if not first and full then
    -- A longer expired prefix (the key was idle, or kept rejecting): count all of it.
    if bounded then return false end
    local all = redis.call('ZRANGEBYSCORE', key, 0, fmt(low))
    expired, gone = 0, #all
    for i = 1, #all do expired = expired + swl_units(all[i]) end
    local live = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(low), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if live[2] then oldest = tonumber(live[2]) end
  end
  if not newest then
    -- No '>' (a log written before it): the last member is the newest.
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    newest = last[2] and max(tonumber(last[2]), 0) or 0
  end
  local in_window = total - expired
  local kth = 0
  if in_window > 0 then
    local k = 1
    if in_window + p.c > p.L then
      k = 0
      if p.c <= p.L then k = in_window + p.c - p.L end
    end
    if k == 1 then
      kth = oldest
    elseif k > 1 then
      -- The k-th oldest unit is within the first k members: each holds at least one. The
      -- head often has it.
      local seen = 0
      if first then
        for i = first, #head, 2 do
          seen = seen + swl_units(head[i])
          if seen >= k then
            kth = tonumber(head[i + 1])
            break
          end
        end
      end
      if kth == 0 then
        if bounded and full then return false end
        local r = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(low), '+inf', 'WITHSCORES', 'LIMIT', 0, fmt(k))
        seen = 0
        for i = 1, #r, 2 do
          seen = seen + swl_units(r[i])
          if seen >= k then
            kth = tonumber(r[i + 1])
            break
          end
        end
      end
    end
  end
  return { in_window, kth, in_window > 0 and newest or 0, total, expired, gone, newest, expires }
end

function ALG.swl.default()
  return { 0, 0, 0, 0, 0, 0, 0, 0, fresh = true }
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
-- the Rust log. The key lives until the newest member leaves the window, or longer when
-- it already does (a key shared by quotas of different periods keeps the longest one's
-- state, as MemoryStore does): `PEXPIRE … GT` never shortens it (Redis 7.0).
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
  total = total + p.c
  local needs = ts + p.W
  -- On the server's clock the TTL's end is kept in '~' and set only when a commit needs
  -- it to reach further, then with some slack; on a client's clock (which may step) it is
  -- set on every commit, never shorter than it is.
  local server = ARGV[1] == ''
  local ends = nil
  if server and (s.fresh or needs > s[8]) then ends = needs + min(p.W, SWL_SLACK) end
  if ends then
    redis.call('ZADD', key, fmt(ts), fmt(ts) .. ':' .. fmt(units), fmt(-1 - total), '#',
      fmt(-1 - ts), '>', fmt(-1 - ends), '~')
  else
    redis.call('ZADD', key, fmt(ts), fmt(ts) .. ':' .. fmt(units), fmt(-1 - total), '#', fmt(-1 - ts), '>')
  end
  if s.fresh then
    redis.call('PEXPIRE', key, fmt(ttl_ms(ends or needs, now)))
  elseif ends or not server then
    redis.call('PEXPIRE', key, fmt(ttl_ms(ends or needs, now)), 'GT')
  end
end

-- Gives back the c units of the commit recorded at `at`, from its own member, while it
-- is still in the window: never units of other requests.
function ALG.swl.refund_key(key, p, now)
  if p.at + p.W <= now then return end
  local same = redis.call('ZRANGEBYSCORE', key, fmt(p.at), fmt(p.at))
  if not same[1] then return end
  local units = swl_units(same[1])
  local take = min(units, p.c)
  local t = redis.call('ZSCORE', key, '#')
  local total = (t and -1 - tonumber(t) or 0) - take
  if total <= 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('ZREM', key, same[1])
  if units > take then
    redis.call('ZADD', key, fmt(p.at), fmt(p.at) .. ':' .. fmt(units - take), fmt(-1 - total), '#')
  else
    -- Its member is gone: the newest is now the last one left.
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('ZADD', key, fmt(-1 - total), '#', fmt(-1 - max(tonumber(last[2]), 0)), '>')
  end
end
