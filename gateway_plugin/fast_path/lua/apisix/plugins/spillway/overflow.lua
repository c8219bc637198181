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

-- policy/overflow.py's saturated: local is past what it can take at all.
local function saturated(load, policy, latency)
    return latency - load.compute_ms > policy.max_queue_ms
        or latency > policy.latency_target_ms * policy.saturation_ratio
end
_M.saturated = saturated

-- The verdicts, as counts: latency_of grows with the requests this node has at the cluster, so
-- each condition on it holds from some count on. A model's load under a route's policy gives the
-- counts from which it is hot (enter; and stays hot from stay), saturated, worth growing a cold
-- target for, and past each cold start (cold_at): a request compares its count with them instead
-- of estimating its latency. Found once per table, route and model by bisection over the same
-- expressions a request would evaluate, so the two agree at every count. (No closures: a function
-- that makes one is not compiled, and would cost decide() its trace.)
local HIGHEST = 2 ^ 40
local ENTER, STAY, SATURATED, GROW, COLD = 1, 2, 3, 4, 5

local function holds(v, kind, n, cold_start_ms)
    local load, policy = v.load, v.policy
    local latency = latency_of(load, policy, v.counted and n or nil)
    if kind == ENTER then
        return latency + v.reserve > v.target_ms * policy.enter_ratio
    elseif kind == STAY then
        return not (latency + v.reserve < v.target_ms * policy.exit_ratio)
    elseif kind == SATURATED then
        return saturated(load, policy, latency)
    elseif kind == GROW then
        return latency > v.target_ms or saturated(load, policy, latency)
    end
    return latency - load.compute_ms >= cold_start_ms
end

local function from(v, kind, cold_start_ms)
    if not holds(v, kind, HIGHEST, cold_start_ms) then
        return math.huge
    end
    if holds(v, kind, 0, cold_start_ms) then
        return 0
    end
    local low, high = 0, HIGHEST  -- not holds at low, holds at high
    while high - low > 1 do
        local mid = math.floor((low + high) / 2)
        if holds(v, kind, mid, cold_start_ms) then
            high = mid
        else
            low = mid
        end
    end
    return high
end

local function cold_at(v, cold_start_ms)
    local at = v.cold[cold_start_ms]
    if at == nil then
        at = from(v, COLD, cold_start_ms)
        v.cold[cold_start_ms] = at
    end
    return at
end
_M.cold_at = cold_at

-- counted: whether the request's count is this node's (else the table's estimate alone).
local function verdict(load, policy, target_ms, counted)
    local v = { load = load, policy = policy, target_ms = target_ms, counted = counted,
                reserve = reserve_of(load, policy), cold = {} }
    v.enter, v.stay = from(v, ENTER), from(v, STAY)
    v.saturated, v.grow = from(v, SATURATED), from(v, GROW)
    return v
end

-- The verdicts for a request that counts in_flight (nil or negative: not counted) and the count
-- to compare with them, from the route policy's own cache (a policy lives as long as its table).
function _M.verdicts(policy, load, target_ms, in_flight)
    local counted = in_flight ~= nil and in_flight >= 0
    local cache = policy.verdicts
    if cache == nil then
        cache = setmetatable({}, { __mode = "k" })
        policy.verdicts = cache
    end
    local by_count = cache[load]
    if by_count == nil then
        by_count = { [true] = {}, [false] = {} }
        cache[load] = by_count
    end
    local by_target = by_count[counted]
    local v = by_target[target_ms]
    if v == nil then
        v = verdict(load, policy, target_ms, counted)
        by_target[target_ms] = v
    end
    return v, counted and in_flight or 0
end

return _M
