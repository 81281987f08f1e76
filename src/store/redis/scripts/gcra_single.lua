-- GCRA for a check of one rule: tat_single.lua's decision under the tag 'gcra'.
local function decide(key, o)
  return tat_decide(key, o, 'gcra', 'GCRA')
end
