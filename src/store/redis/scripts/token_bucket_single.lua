-- The token bucket for a check of one rule, decided as its GCRA twin
-- (src/algorithm/token_bucket.rs): tat_single.lua's decision under the tag 'tb', whose
-- keys are its own.
local function decide(key, o)
  return tat_decide(key, o, 'tb', 'token bucket')
end
