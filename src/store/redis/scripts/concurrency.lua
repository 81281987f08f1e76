-- Concurrency (src/algorithm/concurrency.rs, Rule::concurrent; issue 42): the permits a
-- key holds, in one hash per key (so in the key's cluster slot): 'last' (the last permit
-- id given), 'h' (the recent hold times in µs, newest last, at most 8, comma separated),
-- and one field per permit, named by its id, holding 'units:lapse:since' (µs). A permit
-- whose lapse time has passed is gone: the server that held it stopped renewing it
-- (renew.lua). L is n, W the hold limit (µs). Ids grow and are at least the time of
-- their commit, so an id given before the hash expired is never given again: a release
-- (refund, `at` the id) may be sent twice, and gives back at most once.
ALG.conc = {}

function ALG.conc.read(key, p, now)
  local all = redis.call('HGETALL', key)
  if #all == 0 then return nil end
  local s = { used = 0, last = 0, holds = {}, lapsed = {} }
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if f == 'last' then
      s.last = tonumber(v)
    elseif f == 'h' then
      for part in string.gmatch(v, '[^,]+') do s.holds[#s.holds + 1] = tonumber(part) end
    else
      local units, lapse = string.match(v, '^(%d+):(%d+)')
      if tonumber(lapse) <= now then
        s.lapsed[#s.lapsed + 1] = f
      else
        s.used = s.used + tonumber(units)
      end
    end
  end
  return s
end

function ALG.conc.default()
  return { used = 0, last = 0, holds = {}, lapsed = {} }
end

-- admitted iff the permits held (not lapsed) and the cost fit in n; a cost of 0 asks
-- whether one more would fit
function ALG.conc.decide(s, p, now)
  return s.used + max(p.c, 1) <= p.L
end

-- permits held, the median recent hold time (0: none; the upper one of an even count),
-- and the id a commit gives now
function ALG.conc.fields(s)
  local h = {}
  for i = 1, #s.holds do
    if s.holds[i] > 0 then h[#h + 1] = s.holds[i] end
  end
  table.sort(h)
  local median = 0
  if #h > 0 then median = h[floordiv(#h, 2) + 1] end
  return s.used, median, s.last + 1
end

function ALG.conc.room(s, p, now)
  return 0
end

local function conc_id(s, now)
  return max(now, s.last + 1)
end

-- Takes c permits as one entry, lapsing a hold limit from now unless renewed; the hash
-- lives a hold limit more (its hold times are kept that long).
function ALG.conc.commit(key, s, p, now)
  local id = conc_id(s, now)
  if #s.lapsed > 0 then redis.call('HDEL', key, unpack(s.lapsed)) end
  redis.call('HSET', key, fmt(id), fmt(p.c) .. ':' .. fmt(now + p.W) .. ':' .. fmt(now), 'last', fmt(id))
  redis.call('PEXPIRE', key, fmt(ttl_keep(key, now + 2 * p.W, now)))
end

-- p.at: the permit's id. Given back if the hash holds it, and its hold time recorded.
function ALG.conc.refund_key(key, p, now)
  local f = fmt(p.at)
  local v = redis.call('HGET', key, f)
  if not v then return end
  redis.call('HDEL', key, f)
  local since = tonumber(string.match(v, '^%d+:%d+:(%d+)'))
  local held = max(now - since, 1)
  local h = redis.call('HGET', key, 'h')
  local parts = {}
  if h then
    for part in string.gmatch(h, '[^,]+') do parts[#parts + 1] = part end
  end
  parts[#parts + 1] = fmt(held)
  while #parts > 8 do table.remove(parts, 1) end
  redis.call('HSET', key, 'h', table.concat(parts, ','))
end

-- p.at: the permit's id. Lives a hold limit from now if the hash still holds it (a permit
-- given back or lapsed is not made again).
function ALG.conc.renew_key(key, p, now)
  local f = fmt(p.at)
  local v = redis.call('HGET', key, f)
  if not v then return end
  local units, lapse, since = string.match(v, '^(%d+):(%d+):(%d+)')
  if tonumber(lapse) <= now then
    redis.call('HDEL', key, f)
    return
  end
  redis.call('HSET', key, f, units .. ':' .. fmt(now + p.W) .. ':' .. since)
  redis.call('PEXPIRE', key, fmt(ttl_keep(key, now + 2 * p.W, now)))
end
