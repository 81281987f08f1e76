-- Sliding window log (src/algorithm/sliding_window_log.rs). A sorted set with one member
-- per accepted unit, scored by its timestamp. Members are '<ts>:<seq>' with seq counting
-- 1, 2, … within one timestamp, written with a length letter first ('a1' … 'a9', 'b10')
-- so that members of one score sort by seq: the newest unit is always the last member.
ALG.swl = {}

local function swl_member(ts, seq)
  local d = fmt(seq)
  return fmt(ts) .. ':' .. string.char(96 + #d) .. d
end

-- Reads the log's summary (sliding_window_log::Summary): units in (now - W, now], the
-- timestamp of the k-th oldest of them where k is how many must leave before c more
-- fit, and the newest timestamp. Reads only.
function ALG.swl.read(key, p, now)
  local low = '(' .. fmt(now - p.W)
  local in_window = redis.call('ZCOUNT', key, low, '+inf')
  local kth, newest = 0, 0
  if in_window > 0 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    newest = tonumber(last[2])
    local k = 0
    if p.c <= p.L and in_window + p.c > p.L then k = in_window + p.c - p.L end
    if k > 0 then
      local r = redis.call('ZRANGEBYSCORE', key, low, '+inf', 'WITHSCORES', 'LIMIT', fmt(k - 1), 1)
      kth = tonumber(r[2])
    end
  end
  return { in_window, kth, newest }
end

function ALG.swl.default()
  return { 0, 0, 0 }
end

-- accept iff units in the window + c <= L
function ALG.swl.decide(s, p, now)
  return s[1] + p.c <= p.L
end

function ALG.swl.fields(s)
  return s[1], s[2], s[3]
end

-- Drops entries <= now - W and records c units at max(now, newest) (a clock that
-- stepped back still records in order, as the Rust log does).
function ALG.swl.commit(key, s, p, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - p.W))
  local ts = max(now, s[3])
  local have = 0
  if ts == s[3] then have = redis.call('ZCOUNT', key, fmt(ts), fmt(ts)) end
  local args, j = {}, 1
  while j <= p.c do
    args[#args + 1] = fmt(ts)
    args[#args + 1] = swl_member(ts, have + j)
    if #args >= 1000 or j == p.c then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
    j = j + 1
  end
  redis.call('PEXPIRE', key, fmt(ttl_ms(ts + p.W, now)))
end

-- Gives back the newest c units.
function ALG.swl.refund_key(key, p, now)
  redis.call('ZPOPMAX', key, fmt(p.c))
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    local expires = tonumber(last[2]) + p.W
    if expires <= now then
      redis.call('DEL', key)
    else
      redis.call('PEXPIRE', key, fmt(ttl_ms(expires, now)))
    end
  end
end
