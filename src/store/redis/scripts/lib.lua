-- tollgate: helpers shared by every script. The scripts are this file, then the
-- algorithms they need (each adds itself to ALG), then a main (check.lua or refund.lua).
--
-- ARGV[1]  now in µs since the epoch, or '' to read the server's TIME
-- ARGV[2]  mode: 'c' check (commit when every rule accepts), 'p' peek (never writes)
-- then 8 values per rule, in KEYS order:
--          algorithm tag, limit L, period W (µs), burst B, emission interval T (µs),
--          cost c, leaky bucket max delay (µs) or, for GCRA and the token bucket, a
--          quota slice's `ahead + after·2^26` (how far past the burst it reaches, and
--          how long after now its first slot comes at the earliest, µs; 0 for a
--          request's check),
--          block (µs, 0: none; Rule::block_for)
-- (the refund script takes a 9th: `at`, where the commit recorded its units; see
-- `Taken` in src/store/mod.rs)
-- KEYS: the rules' state keys, then (check script only) the block key of each rule whose
-- block is not 0, in the same order.
--
-- All values are integers below 2^53 held in Lua doubles, so every operation below is
-- exact (the sliding window counter's estimate is the one stated double computation).
-- Numbers are written with '%.0f', never tostring (which gives 1.7e+15).

local ALG = {}

-- How far a charge can put a key into debt (src/algorithm/mod.rs MAX_DEBT): 2^46 µs of
-- time ahead of now, or 2^46 units in a window. Each algorithm's `room` says how many
-- units a charge may still take.
local MAX_DEBT = 70368744177664

local function fmt(x)
  return string.format('%.0f', x)
end

local function max(a, b)
  if a > b then return a end
  return b
end

local function min(a, b)
  if a < b then return a end
  return b
end

-- Milliseconds until `expires`, rounded up, plus one so that a key never disappears
-- before its state is the same as never seen.
local function ttl_ms(expires, now)
  local ms = floordiv(expires - now + 999, 1000) + 1
  if ms < 1 then ms = 1 end
  return ms
end

-- Stores a packed string state that is "never seen" from `expires` on. For writes whose
-- expiry never moves earlier: commits of GCRA (and of its twin, the token bucket) and of
-- the leaky bucket (their expiry is their state, which a commit only moves later) and of the window algorithms (a window of
-- another period does not match the stored one, so its state is replaced anyway).
local function put(key, value, expires, now)
  if expires <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, value, 'PX', fmt(ttl_ms(expires, now)))
  end
end

-- The TTL for `expires`, or the longer one the key already has: a key shared by quotas
-- of different periods (tiers) keeps the longest one's state, as MemoryStore does.
local function ttl_keep(key, expires, now)
  local ms = ttl_ms(expires, now)
  local left = redis.call('PTTL', key)
  if left > ms then return left end
  return ms
end

-- `put` for writes whose expiry may move earlier (refunds): one PTTL more, and a longer
-- TTL is kept.
local function put_keep(key, value, expires, now)
  if expires <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, value, 'PX', fmt(ttl_keep(key, expires, now)))
  end
end

-- The packed fields of a string state ('a:b:c') as numbers, or nil when absent.
local function load(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  local out = {}
  for part in string.gmatch(v, '[^:]+') do
    out[#out + 1] = tonumber(part)
  end
  return out
end

-- The most units one check can ever take: a larger cost is refused with no retry. The
-- leaky bucket's queue holds B waiting besides the one leaving; the token bucket and GCRA
-- hold B; the window algorithms L.
local function capacity(p)
  if p.alg == 'lb' then return p.B + 1 end
  if p.alg == 'tb' or p.alg == 'gcra' then return p.B end
  return p.L
end

local function read_now(arg)
  if arg ~= '' then return tonumber(arg) end
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The parameters of the i-th rule, when each rule has `stride` values (8, or 9 with `at`).
local function params(i, stride)
  local b = 2 + (i - 1) * stride
  return {
    alg = ARGV[b + 1],
    L = tonumber(ARGV[b + 2]),
    W = tonumber(ARGV[b + 3]),
    B = tonumber(ARGV[b + 4]),
    T = tonumber(ARGV[b + 5]),
    c = tonumber(ARGV[b + 6]),
    md = tonumber(ARGV[b + 7]),
    blk = tonumber(ARGV[b + 8]),
    at = tonumber(ARGV[b + 9]),
  }
end
