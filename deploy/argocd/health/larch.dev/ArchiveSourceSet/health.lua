-- Argo CD health of a larch.dev ArchiveSourceSet, from its kstatus conditions (Ready, Reconciling,
-- Stalled; see docs/gitops.md). Runs in Argo CD's default sandbox (no standard libraries needed).
local function msg(c)
  local reason = c.reason or c.type
  if c.message ~= nil and c.message ~= "" then return reason .. ": " .. c.message end
  return reason
end
if obj.status == nil or obj.status.conditions == nil then
  return {status = "Progressing", message = "Waiting for the operator's first status"}
end
if obj.status.observedGeneration ~= obj.metadata.generation then
  return {status = "Progressing", message = "Waiting for the operator to observe generation " .. obj.metadata.generation}
end
local cond = {}
for _, c in ipairs(obj.status.conditions) do cond[c.type] = c end
if cond.Stalled ~= nil and cond.Stalled.status == "True" then
  return {status = "Degraded", message = msg(cond.Stalled)}
end
if cond.Ready ~= nil and cond.Ready.status == "True" then
  return {status = "Healthy", message = msg(cond.Ready)}
end
if cond.Reconciling ~= nil and cond.Reconciling.status == "True" then
  return {status = "Progressing", message = msg(cond.Reconciling)}
end
if cond.Ready ~= nil then return {status = "Progressing", message = msg(cond.Ready)} end
return {status = "Progressing", message = "Waiting for the Ready condition"}
