-- A decision and its place, taken together: the live counters decide() reads from the shared dict
-- (what this node has in flight at each target and at the cluster, what it has spent, the probes
-- it has taken), and the reservation of a target's cap, budget and half-open probe, or of the
-- half-open cluster's probe, and of a tenant's concurrency slot, atomically across workers.

local contract = require("apisix.plugins.spillway.contract")
local counters = require("apisix.plugins.spillway.counters")
local decide = require("apisix.plugins.spillway.decide")

local PREFIX = contract.PREFIX
local dkey = counters.key

local _M = {}

-- dict(): the shared dict; tbl(): the decision table this worker last compiled; keys(): the dict
-- keys of its targets and models (counters.keys, made anew with each table version).
function _M.new(dict, tbl, keys)
    -- Live counters read from the shared dict: what this node has in flight and has spent.
    local live = {}
    function live.in_flight(_, name)
        return dict():get(dkey(keys().inflight, name)) or 0
    end
    -- What streams settled below their price gave back of it (spillway/stream.lua), past its mark.
    local function given_back(d_, name, spec)
        return counters.since_mark(d_:get(dkey(keys().given_back, name)) or 0, spec.given_back_mark)
    end
    function live.spent(_, name)
        local d_, spec = dict(), tbl().targets[name]
        return counters.since_mark(d_:get(dkey(keys().spent, name)) or 0, spec.spent_mark)
            - given_back(d_, name, spec)
    end
    -- The tenant whose slot this request took before deciding, and its count before that.
    local slot = { tenant = nil, before = 0 }
    function live.tenant_in_flight(_, tenant)
        if tenant == slot.tenant then
            return slot.before
        end
        return dict():get(PREFIX.tenant_in_flight .. tenant) or 0
    end
    function live.probe_allowed(_, name, spec)
        return spec.probe_allowed and dict():get(dkey(keys().probe, name)) == nil
    end
    -- Those of a target's that were sent there cold (each starting an instance).
    function live.starting(_, name)
        return dict():get(dkey(keys().cold, name)) or 0
    end
    -- This node's requests at the cluster for the table's model key: counted when decided local,
    -- released in the log phase, so exact between the table's scrapes.
    function live.local_in_flight(_, model_key)
        return dict():get(dkey(keys().local_, model_key)) or 0
    end

    -- Whether this node may send the half-open cluster a probe (one a second, taken in local_probe).
    function live.local_probe_allowed(_, model_key)
        return dict():get(PREFIX.local_probe .. model_key) == nil
    end

    local full = {}
    function full.in_flight() return math.huge end
    full.spent, full.tenant_in_flight, full.probe_allowed = live.spent, live.tenant_in_flight, live.probe_allowed
    full.local_in_flight, full.starting = live.local_in_flight, live.starting
    full.local_probe_allowed = live.local_probe_allowed

    -- A local decision while the table says the cluster fails is its probe: taken atomically across
    -- workers, one a second per node; false when another worker took it first.
    local function local_probe(f, tbl)
        local key = (f.model and tbl["local"][f.model]) and f.model or ""
        local load = tbl["local"][key]
        if not (load and load.failing) then
            return true
        end
        return dict():safe_add(PREFIX.local_probe .. key, true, 1)
    end

    local function within(spend, limit)
        return limit == nil or spend <= limit
    end

    -- Take the decision's place under the cap, the budget and the half-open probe, atomically across
    -- workers; false (and nothing taken) when another worker got there first.
    local function reserve(d, spec)
        local d_ = dict()
        local ring = keys()
        local key, spend_key = dkey(ring.inflight, d.target), dkey(ring.spent, d.target)
        local in_flight = counters.add(d_, key, 1)
        if in_flight == nil or in_flight > spec.cap then
            counters.release(d_, key)
            return false
        end
        local total = counters.add(d_, spend_key, d.cost_usd)
        if total == nil then
            counters.release(d_, key)
            return false
        end
        local spent = counters.since_mark(total, spec.spent_mark) - given_back(d_, d.target, spec)
        local probe_ok = spec.breaker ~= contract.BREAKER.half_open or d_:safe_add(dkey(ring.probe, d.target), true, 1)
        if within(spec.spent_hour_usd + spent, spec.hourly_usd)
            and within(spec.spent_day_usd + spent, spec.daily_usd) and probe_ok then
            if d.reason == contract.REASON.overflow_cold and counters.add(d_, dkey(ring.cold, d.target), 1) then
                d.cold_counted = true
            end
            return true
        end
        counters.release(d_, key)
        d_:incr(spend_key, -d.cost_usd)
        return false
    end

    local function decide_and_reserve(f, tbl, policy)
        for _ = 1, 4 do
            local d = decide.decide(f, tbl, policy, live)
            if (d.target == decide.LOCAL and local_probe(f, tbl)) or d.target == decide.SHED
                or (d.target ~= decide.LOCAL and reserve(d, tbl.targets[d.target])) then
                return d
            end
        end
        return decide.decide(f, tbl, policy, full)
    end

    -- Take the tenant's slot before deciding (as reserve() does for target caps), so two workers
    -- cannot both see room for the last one; decide() then reads the count as it was before.
    local function reserve_tenant(f, policy, log_sometimes)
        local tenant = f.headers[policy.tenant_header]
        if tenant == nil or tenant == "" then
            return nil
        end
        local quota = policy.quotas[tenant] or policy.default_quota
        if not quota.concurrency then
            return nil
        end
        local count, err = counters.take_tenant(dict(), PREFIX.tenant_in_flight .. tenant)
        if count == nil then
            -- Clients choose tenant names: a full dict stops counting new tenants, nothing else.
            log_sometimes("tenant_slots", "spillway: shared dict ", contract.DICT, " full: tenant in-flight ",
                          "counts not kept for new tenants (", err, "); make it larger")
            return nil
        end
        slot.tenant, slot.before = tenant, count - 1
        return tenant
    end

    local function release_tenant(tenant)
        counters.release_tenant(dict(), PREFIX.tenant_in_flight .. tenant)
    end

    return { live = live, slot = slot, decide = decide_and_reserve, tenant = reserve_tenant,
             release_tenant = release_tenant }
end

return _M
