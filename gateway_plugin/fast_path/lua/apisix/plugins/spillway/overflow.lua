-- When a request that may leave should: policy/overflow.py in Lua, for decide.lua. Pure
-- functions of a load from the decision table, the route's policy and this node's own count of
-- the requests it has at the cluster.

local _M = {}

-- policy/overflow.py's estimated_latency_ms: the table's estimate from the scrape, or, where
-- this node counts what it has at the cluster, the larger of the count's (all but
-- capacity - 1 of them finish first) and the scrape's backlog (other gateways' requests). The
-- capacity is the table's: what the cluster's members that answer run at once.
local function latency_of(load, policy, in_flight)
    if in_flight == nil or in_flight < 0 or load.compute_ms <= 0 then
        return load.latency_ms
    end
    local c = load.capacity
    local own = math.max(0, in_flight - c + 1) * load.compute_ms / c + load.compute_ms
    return math.max(own, load.backlog_ms)
end
_M.latency_of = latency_of

-- policy/overflow.py's onprem_reserve_ms: the latency kept free for on-prem-only requests.
local function reserve_of(load, policy)
    local headroom, c = policy.onprem_headroom, load.capacity
    if load.compute_ms <= 0 or load.onprem_rps <= 0 or headroom <= 0 then
        return 0
    end
    local rho = load.onprem_rps * load.compute_ms / 1000 / c
    if rho >= 1 then
        return math.huge
    end
    return headroom * load.compute_ms / c * rho / (1 - rho)
end

-- Hysteresis on the latency plus the headroom: enter above target x enter_ratio, leave below
-- target x exit_ratio, else keep.
local function overflowing(load, target_ms, policy, latency)
    local need = latency + reserve_of(load, policy)
    if need > target_ms * policy.enter_ratio then
        return true
    end
    if need < target_ms * policy.exit_ratio then
        return false
    end
    return load.overflowing
end
_M.reserve_of, _M.overflowing = reserve_of, overflowing

return _M
