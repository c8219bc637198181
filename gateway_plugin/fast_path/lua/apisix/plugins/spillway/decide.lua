-- Where each request goes, decided inside APISIX: gateway_plugin/policy/decide.py's decide(), in Lua.
--
-- A pure function of the request's features, the runner's decision table, the route's policy
-- and the live counters (in-flight requests and spend since the table was made). It reads no
-- clock and does no I/O, so the equivalence test can run it on any case the Python policy runs.
-- Every step mirrors policy.py and keeps its order: residency, tenant quota, the deadline, rules,
-- overflow, cold starts, targets, and local or shed when nothing is eligible.

local C = require("apisix.plugins.spillway.contract")
local overflow = require("apisix.plugins.spillway.overflow")
local route = require("apisix.plugins.spillway.route")
local latency_of, reserve_of, overflowing = overflow.latency_of, overflow.reserve_of, overflow.overflowing

local re_find = ngx.re.find
local str_lower = string.lower
local str_byte, str_sub = string.byte, string.sub
local ipairs = ipairs

local _M = {}

local LOCAL, SHED = C.TARGET["local"], C.TARGET.shed
local R, ACTION, BREAKER, SPELLING, ADMISSION = C.REASON, C.ACTION, C.BREAKER, C.SPELLING, C.ADMISSION
local SATURATED = SPELLING.label_sep .. SPELLING.saturated
_M.LOCAL, _M.SHED = LOCAL, SHED
local NO_LOAD = { fresh = false, latency_ms = 0, backlog_ms = 0, compute_ms = 0, overflowing = false,
                  onprem_rps = 0, gauges_hot = false, failing = false, probe_allowed = false,
                  capacity = 1 }
local NO_TARGET_STATE = { breaker = BREAKER.closed, probe_allowed = false, warm = 0,
                          spent_hour_usd = 0, spent_day_usd = 0 }
local NO_TENANT = { requests_last_minute = 0, spent_hour_usd = 0, spent_day_usd = 0 }
local NO_QUOTA = {}

-- Python's str.strip(): ASCII whitespace including the four separators \x1c-\x1f.
local function space(b)
    return b == 32 or (b >= 9 and b <= 13) or (b >= 28 and b <= 31)
end

local function strip(s)
    local first, last = 1, #s
    while first <= last and space(str_byte(s, first)) do
        first = first + 1
    end
    while last >= first and space(str_byte(s, last)) do
        last = last - 1
    end
    if first == 1 and last == #s then
        return s
    end
    return str_sub(s, first, last)
end

local function full_match(pattern, subject)
    return re_find(subject, "\\A(?:" .. pattern .. ")\\z", "jo") ~= nil
end
_M.full_match = full_match

local function rule_matches(rule, f)
    if rule.models_set and not (f.model and rule.models_set[f.model]) then
        return false
    end
    if rule.uri and not re_find(f.path, rule.uri, "jo") then
        return false
    end
    for _, h in ipairs(rule.headers) do
        if not full_match(h[2], f.headers[h[1]] or "") then
            return false
        end
    end
    for _, a in ipairs(rule.args) do
        if not full_match(a[2], f.args[a[1]] or "") then
            return false
        end
    end
    return true
end
_M.rule_matches = rule_matches

local function may_leave(f, policy)
    local label = f.headers[policy.classification_header]
    if label == nil or strip(label) == "" then
        return policy.unclassified_may_leave
    end
    return policy.cloud_allowed_set[str_lower(strip(label))] == true
end
_M.may_leave = may_leave

local function decision(target, reason, extra)
    local d = extra or {}
    d.target, d.reason = target, reason
    d.status = d.status or 0
    return d
end

-- latency: the estimate decide() made (the table's alone when omitted, as on the fail-safe path).
local function stay_local(load, policy, reason, tenant, hot, residency_kept, latency)
    if load.fresh then
        latency = latency or load.latency_ms
        if latency - load.compute_ms > policy.max_queue_ms
            or latency > policy.latency_target_ms * policy.saturation_ratio then
            return decision(SHED, reason, { status = 503, retry_after_s = policy.retry_after_s,
                residency_kept = residency_kept, overflowing = hot, tenant = tenant,
                local_saturated = true })
        end
    end
    return decision(LOCAL, reason, { residency_kept = residency_kept, overflowing = hot,
                                      tenant = tenant })
end
_M.stay_local = stay_local

local function quota_of(policy, tenant)
    if tenant == nil then
        return NO_QUOTA
    end
    return policy.quotas[tenant] or policy.default_quota
end

local function over_quota(tenant, tbl, policy, live)
    if tenant == nil then
        return nil
    end
    local quota = quota_of(policy, tenant)
    local state = tbl.tenants[tenant] or NO_TENANT
    local rpm = quota.requests_per_minute
    if rpm and state.requests_last_minute >= rpm then
        return decision(SHED, R.tenant_rate, { status = 429, retry_after_s = 60, tenant = tenant })
    end
    if quota.concurrency and live:tenant_in_flight(tenant) >= quota.concurrency then
        return decision(SHED, R.tenant_concurrency,
                        { status = 429, retry_after_s = policy.retry_after_s, tenant = tenant })
    end
    return nil
end

local function within(spend, limit)
    return limit == nil or spend <= limit
end

local function tenant_budget_allows(tenant, cost, tbl, policy)
    if tenant == nil then
        return true
    end
    local quota = quota_of(policy, tenant)
    local state = tbl.tenants[tenant] or NO_TENANT
    return within(state.spent_hour_usd + cost, quota.hourly_usd)
        and within(state.spent_day_usd + cost, quota.daily_usd)
end

-- The body's declared size, as request/spillway.py's body_bytes reads it: Content-Length, 0
-- without a body, nil (unknown) when chunked or malformed.
local function body_bytes(headers)
    local declared = headers["content-length"]
    if declared == nil then
        if headers["transfer-encoding"] ~= nil then
            return nil
        end
        return 0
    end
    declared = declared:match("^%s*(.-)%s*$")
    if declared:match("^%d+$") then
        return tonumber(declared)
    end
    return nil
end
_M.body_bytes = body_bytes

-- Whether a target takes a body this size (an unknown size only where no limit is set).
local function takes(spec, f)
    local limit = spec.max_request_bytes
    if limit == nil then
        return true
    end
    if f.body_bytes == nil and not f.body_read then
        f.body_bytes, f.body_read = body_bytes(f.headers), true
    end
    return f.body_bytes ~= nil and f.body_bytes <= limit
end

-- policy/decide.py's _pick_target: the cheapest eligible target with a free warm instance (its
-- price, plus the idle time using it adds to the bill where nothing is in flight there, as of the
-- table: spec.idle_usd), else the chain's first eligible cold one, worth its start only past the
-- local queue or when grow.
local function pick_target(chain, tbl, policy, tenant, local_wait_ms, live, f, grow)
    local first, first_cost, best, best_cost, best_price
    for _, name in ipairs(chain) do
        local spec = tbl.targets[name]
        if spec and not spec.invoke and takes(spec, f) then
            local breaker = spec.breaker or NO_TARGET_STATE.breaker
            local blocked = breaker == BREAKER.open
                or (breaker == BREAKER.half_open and not live:probe_allowed(name, spec))
            local in_flight = live:in_flight(name)
            if not blocked and in_flight < spec.cap then
                local warm = (spec.warm or 0) * spec.slots > in_flight - live:starting(name)
                local startable = warm or local_wait_ms >= spec.cold_start_ms
                if not startable then
                    startable = grow
                    grow = false
                end
                if startable then
                    local cost = warm and spec.cost_usd or spec.cold_cost_usd
                    local extra = live:spent(name)
                    if within(spec.spent_hour_usd + extra + cost, spec.hourly_usd)
                        and within(spec.spent_day_usd + extra + cost, spec.daily_usd)
                        and tenant_budget_allows(tenant, cost, tbl, policy) then
                        if warm then
                            local price = cost + (in_flight == 0 and spec.idle_usd or 0)
                            if best == nil or price < best_price then
                                best, best_cost, best_price = name, cost, price
                            end
                        elseif not first then
                            first, first_cost = name, cost
                        end
                    end
                end
            end
        end
    end
    if best then
        return best, R.overflow_warm, best_cost
    end
    if first then
        return first, R.overflow_cold, first_cost
    end
    return nil
end

-- policy/decide.py's _local_failing: the cluster fails its requests, so one that may leave goes
-- to the chain's first eligible target, warm or cold (local would never answer), and one that may
-- not, or that no target takes, gets 503 at once. A rule that keeps it local keeps it off the cloud.
local function local_failing(f, policy, action, chain, tbl, tenant, live)
    local leaves = may_leave(f, policy)
    if leaves and #chain > 0 and action ~= ACTION["local"] then
        local name, reason, cost = pick_target(chain, tbl, policy, tenant, math.huge, live, f, true)
        if name then
            return decision(name, reason, { overflowing = true, cost_usd = cost, tenant = tenant })
        end
    end
    return decision(SHED, R.local_failing, { status = 503, retry_after_s = policy.retry_after_s,
                    overflowing = true, tenant = tenant, on_prem_only = not leaves })
end

-- policy/admission.py's deadline_ms: the request's deadline in ms (at most max_deadline_ms), nil
-- when it has none; false when its deadline or priority header says neither.
local function deadline_ms(f, policy, target_ms)
    local sheddable = policy.default_sheddable
    if policy.priority_header ~= "" then
        local named = f.headers[policy.priority_header]
        if named ~= nil then
            local priority = str_lower(strip(named))
            if priority ~= ADMISSION.critical and priority ~= ADMISSION.sheddable then
                return false
            end
            sheddable = priority == ADMISSION.sheddable
        end
    end
    if policy.deadline_header ~= "" then
        local given = f.headers[policy.deadline_header]
        if given ~= nil then
            local seconds = strip(given)
            if not full_match(ADMISSION.deadline_syntax, seconds) then
                return false
            end
            return math.min(tonumber(seconds) * 1000, policy.max_deadline_ms)
        end
    end
    if sheddable then
        return target_ms
    end
    return nil
end
_M.deadline_ms = deadline_ms

-- policy/admission.py's invalid_message: what a 400 for a bad deadline or priority says.
function _M.invalid_message(policy)
    local deadline, priority = policy.deadline_header, policy.priority_header
    return (deadline ~= "" and deadline or "-") .. ": seconds to wait (digits, up to 3 decimals); "
        .. (priority ~= "" and priority or "-") .. ": " .. ADMISSION.critical .. " or "
        .. ADMISSION.sheddable
end

-- Steps 3 to 7 of policy/decide.py (its _route); late: the cluster would answer past the
-- request's deadline.
local function routed(f, tbl, policy, live, tenant, load, model_key, target_ms, latency, late, held)
    local rule
    for _, r in ipairs(policy.rules) do
        if rule_matches(r, f) then
            rule = r
            break
        end
    end
    local action = rule and rule.action or ACTION.overflow
    local chain = (rule and #rule.targets > 0) and rule.targets or policy.default_chain
    local rule_name = rule and rule.name
    local hot = false
    if load.fresh then
        hot = overflowing(load, target_ms, policy, held)
    end
    if action == ACTION.shed then
        return decision(SHED, R.rule, { status = 503, retry_after_s = policy.retry_after_s,
                                         tenant = tenant, rule = rule_name })
    end
    if load.failing and not (load.probe_allowed and live:local_probe_allowed(model_key)) then
        return local_failing(f, policy, action, chain, tbl, tenant, live)
    end
    -- A gauge of local.thresholds past its limit spills too (its own hysteresis, applied by the
    -- runner at each scrape: the table carries its verdict).
    local spill = hot or late or (load.fresh and load.gauges_hot)
    local wants_out = #chain > 0 and (action == ACTION.target or (action == ACTION.overflow and spill))
    if not may_leave(f, policy) then
        local d
        if wants_out then
            d = stay_local(load, policy, R.residency, tenant, hot, true, latency)
        else
            d = decision(LOCAL, load.fresh and R.local_ok or R.signals_missing,
                         { overflowing = hot, tenant = tenant })
        end
        d.on_prem_only = true
        return d
    end
    if action == ACTION["local"] then
        return decision(LOCAL, R.rule, { overflowing = hot, tenant = tenant, rule = rule_name })
    end
    if action == ACTION.overflow and not load.fresh then
        return decision(LOCAL, R.signals_missing, { tenant = tenant })
    end
    if not wants_out then
        return decision(LOCAL, R.local_ok, { tenant = tenant })
    end
    local local_wait = math.huge
    if action == ACTION.overflow then
        local_wait = latency - load.compute_ms
    end
    local grow = held > target_ms
        or latency - load.compute_ms > policy.max_queue_ms
        or latency > policy.latency_target_ms * policy.saturation_ratio
    local name, reason, cost = pick_target(chain, tbl, policy, tenant, local_wait, live, f, grow)
    if name then
        return decision(name, reason, { overflowing = hot, cost_usd = cost, tenant = tenant })
    end
    return stay_local(load, policy, R.no_target, tenant, hot, false, latency)
end

-- f: {path, headers (lower-case names, string values), args (string values), model}
-- tbl: the decision table (compiled by the table module); policy: the route's policy;
-- live: in_flight(name), starting(name) (those sent there cold), spent(name),
-- tenant_in_flight(tenant), probe_allowed(name, spec), local_in_flight(model_key): this node's
-- requests at the cluster (nil: not counted), local_probe_allowed(model_key): whether this node
-- may send the half-open cluster its probe.
function _M.decide(f, tbl, policy, live)
    local tenant = f.headers[policy.tenant_header]
    if tenant == "" then
        tenant = nil
    end
    local shed = over_quota(tenant, tbl, policy, live)
    if shed then
        return shed
    end
    local model_key = f.model or ""
    local load = tbl["local"][model_key]
    if load == nil then
        model_key = ""
        load = tbl["local"][""] or NO_LOAD
    end
    local target_ms = policy.model_targets_ms[f.model or ""] or policy.latency_target_ms
    local deadline = deadline_ms(f, policy, target_ms)
    if deadline == false then
        return decision(SHED, R.admission_invalid, { status = 400, retry_after_s = 0, tenant = tenant })
    end
    local latency = 0
    if load.fresh then
        latency = latency_of(load, policy, live:local_in_flight(model_key))
    end
    local late = deadline ~= nil and load.fresh and latency > deadline
    local first_token_ms, held = policy.model_ttft_ms[f.model or ""], latency  -- see decide.py
    if first_token_ms then target_ms, held = first_token_ms, (latency - load.compute_ms) * C.WAIT_TAIL end
    local d = routed(f, tbl, policy, live, tenant, load, model_key, target_ms, latency, late, held)
    if late and d.target == LOCAL then
        return decision(SHED, R.deadline, { status = 503, retry_after_s = policy.retry_after_s,
            residency_kept = d.residency_kept, overflowing = d.overflowing, tenant = tenant,
            on_prem_only = d.on_prem_only })
    end
    return d
end

-- What operators see in X-Spillway-Decision after the target: rule:<name>, +local_saturated.
local function label(d)
    local base = d.reason == R.rule and (SPELLING.rule_prefix .. d.rule) or d.reason
    if d.local_saturated then
        return base .. SATURATED
    end
    return base
end
_M.label = label

function _M.quota_limits(policy, tenant)
    return next(quota_of(policy, tenant)) ~= nil
end

_M.NO_LOAD = NO_LOAD
_M.route_policy, _M.features = route.route_policy, route.features
return _M
