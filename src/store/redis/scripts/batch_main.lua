-- Main of the batch scripts (group commit, src/store/redis/batch.rs): one decision per key,
-- in the order of KEYS, each as its own single-rule check of `decide` (from
-- <algorithm>_single.lua) at one `now`. A decision reads the state the decisions before it
-- left, so two decisions on one key are decided one after the other, as two calls would.
--
-- ARGV[1] now (or '' for TIME), ARGV[2] mode, ARGV[2 + i] the offset o of decision i's 8
-- rule arguments, which are ARGV[o + 1 .. o + 8] (decisions of one rule share them).
--
-- Reply: { now, then 4 per decision: accepted (1/0), f1, f2, f3 }, or for a decision that
-- failed (a key of another type, a state that does not parse, OOM): 2 and the error. A
-- decision fails before its one write, so a failed decision takes nothing, and the
-- others are decided as if it had not been there. READONLY and MASTERDOWN fail the call.
local out = { now }
for i = 1, #KEYS do
  local ok, r, f1, f2, f3 = pcall(decide, KEYS[i], ARGV[2 + i] + 0)
  local at = 4 * i - 2
  if ok then
    out[at], out[at + 1], out[at + 2], out[at + 3] = r, f1, f2, f3
  else
    -- redis.call raises a table { err = … }; Lua errors are strings.
    local e = type(r) == 'table' and r.err or tostring(r)
    -- The server is a replica (an operator's REPLICAOF, a failover): the whole call fails
    -- as a single check's would, so that the store drops the connection and finds the
    -- primary. No check of this call has written: a replica refuses every write.
    if string.sub(e, 1, 8) == 'READONLY' or string.sub(e, 1, 10) == 'MASTERDOWN' then
      return redis.error_reply(e)
    end
    out[at], out[at + 1], out[at + 2], out[at + 3] = 2, e, 0, 0
  end
end
return out
