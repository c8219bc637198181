-- What happened to the requests this worker decided, summed up between two posts to the runner.
--
-- One entry per request would cost more than the decision itself (encoding here, parsing in the
-- runner), so each worker keeps sums: decisions per label, local answer times per model and how
-- many of those answers were ok and failed (the cluster's health) and per member (the node APISIX
-- sent each to: a wedged member stops counting as capacity), cloud
-- answers ok and failed per target with the instances that answered, quota'd tenants' arrivals
-- and spend, the table's age at each decision (histogram buckets), the few requests residency
-- kept home (for the runner's residency log), and requests and spend per target, tenant and model
-- (the runner's cost series). Every map is bounded; what does not fit is counted as dropped, but
-- for requests and spend, which go to their target's "other" entry so the totals stay whole.
-- Clients choose tenant names, so the maps keyed by them (tenants, usage) share one bound, and
-- every map keyed by the table's names (a target's or the cluster's answers, which breakers and
-- the load estimate read) has a bound of its own: no flood of names can push those out. The
-- runner reads each map to the same bound (fast_path/summary.py MAX_KEYS).

local array_mt = require("cjson.safe").array_mt
local C = require("apisix.plugins.spillway.contract")
local S, SPELLING = C.SUMMARY, C.SPELLING
local LOCAL, SHED = C.TARGET["local"], C.TARGET.shed
local USAGE_SEP, DECISION_SEP = SPELLING.usage_sep, SPELLING.decision_sep
-- The function's answer: the instance that served it, and whether it started cold for it.
local INSTANCE_VAR = "upstream_http_" .. C.HEADER.instance:gsub("-", "_")
local COLD_VAR = "upstream_http_" .. C.HEADER.cold:gsub("-", "_")
local tonumber, tostring, pairs, setmetatable, type = tonumber, tostring, pairs, setmetatable, type
local find, gmatch, gsub, sub = string.find, string.gmatch, string.gsub, string.sub
local max, now = math.max, ngx.now

local _M = {}

-- Upper bounds (seconds) of the table-age buckets; the runner's histogram has the same.
_M.AGE_BOUNDS = { 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5 }
local AGE_BOUNDS, N_BOUNDS = _M.AGE_BOUNDS, #_M.AGE_BOUNDS
local MAX_KEYS = 1000
local MAX_INSTANCES = 64
local MAX_RESIDENCY = 100
-- Upstreams one request's answer names at most (APISIX's retries over the nodes).
local MAX_ATTEMPTS = 16
-- Longest text reported for a request kept home (nginx takes URIs of several KB; the runner
-- refuses an entry over 4,096 characters).
local MAX_TEXT = 1024

function _M.new()
    local ages = {}
    for i = 1, N_BOUNDS + 1 do
        ages[i] = 0
    end
    -- keys: the tenant-keyed maps' entries; sizes: each of the others'.
    return { n = 0, keys = 0, dropped = 0, decisions = {}, sent_local = {}, on_prem = {}, local_s = {},
             sizes = { sent_local = 0, on_prem = 0, local_s = 0, local_answers = 0, cloud = 0, members = 0 },
             local_answers = {}, members = {}, cloud = {}, instances = {}, usage = {}, usage_by = {}, usage_other = {},
             tenants = {}, residency = setmetatable({}, array_mt), table_ages = ages, table_age_sum = 0 }
end

-- The last of nginx's comma-separated values (one per upstream tried), as a number.
local function last_number(raw)
    if type(raw) ~= "string" then
        return tonumber(raw)  -- APISIX's ctx.var gives some of them as numbers already
    end
    if not find(raw, ",", 1, true) and not find(raw, ":", 1, true) then
        return tonumber(raw)  -- one upstream tried (nearly always): no pattern to run
    end
    return tonumber(raw:match("([%d%.]+)%s*$"))
end
_M.last_number = last_number

-- The age's bucket: the first bound it does not pass (N_BOUNDS + 1 past them all). Compared
-- without a loop: one of a varying count stops LuaJIT compiling the log phase that runs it.
local B = AGE_BOUNDS
assert(N_BOUNDS == 10, "bucket() compares ten bounds")
local function bucket(age)
    if age <= B[5] then
        if age <= B[2] then
            return age <= B[1] and 1 or 2
        end
        return age <= B[3] and 3 or (age <= B[4] and 4 or 5)
    end
    if age <= B[8] then
        return age <= B[6] and 6 or (age <= B[7] and 7 or 8)
    end
    return age <= B[9] and 9 or (age <= B[10] and 10 or 11)
end
_M.bucket = bucket

-- An entry of a map keyed by the table's names (name: the map's), within the map's own bound.
local function bounded(agg, name, key, fresh)
    local map = agg[name]
    local entry = map[key]
    if entry == nil then
        local sizes = agg.sizes
        if sizes[name] >= MAX_KEYS then
            agg.dropped = agg.dropped + 1
            return nil
        end
        sizes[name] = sizes[name] + 1
        entry = fresh()
        map[key] = entry
    end
    return entry
end

local function pair() return { 0, 0 } end
local function triple() return { 0, 0, 0 } end

local function answered(counts, code)
    if code > 0 and code < 500 then
        counts[1] = counts[1] + 1
    else
        counts[2] = counts[2] + 1
    end
end

-- A member's answers: ok, failed, and failed since its last ok one (a run of failures crosses
-- batches and the batch's order is known here, so an ok answer before a wedge does not hide it).
local function member(agg, address, code)
    if code and sub(address, 1, 5) ~= "unix:" then
        local m = bounded(agg, S.members, address, triple)
        if m then
            answered(m, code)
            m[3] = (code > 0 and code < 500) and 0 or m[3] + 1
        end
    end
end

-- Each member tried for a request and its answer, as $upstream_addr and $upstream_status list
-- them in order (", ": the next node tried; " : ": an internal redirect).
local function tried(agg, addresses, statuses)
    if type(addresses) ~= "string" or statuses == nil then
        return
    end
    if not find(addresses, " ", 1, true) then
        return member(agg, addresses, tonumber(statuses))  -- one node tried: no pattern to run
    end
    local codes = {}
    for code in gmatch(gsub(tostring(statuses), " : ", ", "), "[^, ]+") do
        codes[#codes + 1] = tonumber(code)
    end
    local i = 0
    for address in gmatch(gsub(addresses, " : ", ", "), "[^, ]+") do
        i = i + 1
        if i > MAX_ATTEMPTS then
            return
        end
        member(agg, address, codes[i])
    end
end

-- seen: what the access phase decided; var: nginx's variables (the function's headers read from
-- them only for cloud answers).
function _M.add(agg, seen, var, status)
    agg.n = agg.n + 1
    local decision = seen.decision
    agg.decisions[decision] = (agg.decisions[decision] or 0) + 1
    local age = seen.table_age_s
    if age then
        local i = bucket(age)
        agg.table_ages[i] = agg.table_ages[i] + 1
        agg.table_age_sum = agg.table_age_sum + age
    end
    if seen.target ~= SHED then
        -- A tab is in no tenant key (printable ASCII) nor model: the key splits back unambiguously.
        -- Found through a map per target and tenant: no key string made per request.
        local target, tenant, model = seen.target, seen.tenant or "", seen.usage_model or ""
        local by_tenant = agg.usage_by[target]
        if by_tenant == nil then
            by_tenant = {}
            agg.usage_by[target] = by_tenant
        end
        local by_model = by_tenant[tenant]
        local u = by_model and by_model[model]
        if u == nil and agg.keys < MAX_KEYS then
            agg.keys = agg.keys + 1
            u = { 0, 0 }
            if by_model == nil then
                by_model = {}
                by_tenant[tenant] = by_model
            end
            by_model[model] = u
            agg.usage[target .. USAGE_SEP .. tenant .. USAGE_SEP .. model] = u
        elseif u == nil then
            u = agg.usage_other[seen.target]
            if u == nil then
                u = { 0, 0 }
                agg.usage_other[seen.target] = u
            end
        end
        u[1], u[2] = u[1] + 1, u[2] + (seen.cost or 0)
    end
    local statuses = var.upstream_status  -- each read of an nginx variable evaluates it anew
    local upstream_status = last_number(statuses)
    if seen.cloud then
        upstream_status = upstream_status or status
        local c = bounded(agg, S.cloud, seen.target, triple)
        if c then
            answered(c, upstream_status)
            c[3] = c[3] + (last_number(var.upstream_response_time) or 0)
        end
        local instance = var[INSTANCE_VAR]
        if instance then
            local seen_here = agg.instances[seen.target]
            if seen_here == nil then
                seen_here = { [0] = 0 }
                agg.instances[seen.target] = seen_here
            end
            if seen_here[instance] == nil and seen_here[0] < MAX_INSTANCES then
                seen_here[0] = seen_here[0] + 1
                seen_here[instance] = var[COLD_VAR] == "1"
            end
        end
    elseif seen.target == LOCAL and upstream_status then
        local a = bounded(agg, S.local_answers, seen.model or "", pair)
        if a then
            answered(a, upstream_status)
        end
        tried(agg, var.upstream_addr, statuses)
        -- Until the answer's first byte: for a stream of generated tokens, its first token.
        local seconds = last_number(var.upstream_header_time) or last_number(var.upstream_response_time)
        if seconds then
            local l = bounded(agg, S.local_s, seen.model or "", pair)
            if l then
                l[1], l[2] = l[1] + 1, l[2] + seconds
            end
        end
    end
end

local function count(agg, name, model)
    local map = agg[name]
    local sizes = agg.sizes
    if map[model] == nil then
        if sizes[name] >= MAX_KEYS then
            agg.dropped = agg.dropped + 1
            return
        end
        sizes[name] = sizes[name] + 1
    end
    map[model] = (map[model] or 0) + 1
end

-- The runner spreads what the summary counts at decisions over the time since the first of them:
-- it adds to the cluster's backlog only the requests sent local after its last scrape, and to the
-- on-prem-only arrival rate each request as of when it came.
local function decided(agg, name, model)
    if agg.decided_from == nil then
        agg.decided_from = now()
    end
    count(agg, name, model)
end

-- Requests sent local, per model: the cluster's backlog estimate.
function _M.sent_local(agg, model)
    decided(agg, S.sent_local, model)
end

-- Requests that may not leave, per model: the runner measures the headroom they need from them.
function _M.on_prem(agg, model)
    decided(agg, S.on_prem, model)
end

local function clipped(text)
    if type(text) == "string" and #text > MAX_TEXT then
        return text:sub(1, MAX_TEXT)
    end
    return text
end

function _M.kept_home(agg, request)
    if #agg.residency < MAX_RESIDENCY then
        agg.residency[#agg.residency + 1] = { path = clipped(request.path), model = clipped(request.model),
                                              classification = clipped(request.classification),
                                              content = request.content }
    else
        agg.dropped = agg.dropped + 1
    end
end

-- X-Spillway-Decision's "target;label", made once per pair (both come from the table: few).
local decision_texts = {}
function _M.decision_text(target, label)
    local by_label = decision_texts[target]
    if by_label == nil then
        by_label = {}
        decision_texts[target] = by_label
    end
    local text = by_label[label]
    if text == nil then
        text = target .. DECISION_SEP .. label
        by_label[label] = text
    end
    return text
end

-- A quota'd tenant's `arrivals` and `usd` spent (less than nothing: a stream settled below its
-- price), counted from the decision as the runner counts its own: counted only once answered, a
-- tenant could start any number of slow answers (streams of minutes) within its quotas.
function _M.tenant(agg, tenant, arrivals, usd)
    local t = agg.tenants[tenant]
    if t == nil and agg.keys < MAX_KEYS then
        agg.keys = agg.keys + 1
        t = { 0, 0 }
        agg.tenants[tenant] = t
    elseif t == nil then
        agg.dropped = agg.dropped + 1
        return
    end
    t[1], t[2] = t[1] + arrivals, t[2] + usd
end

-- Whether the summary has anything to say (a tenant's count comes before its request's answer).
function _M.pending(agg)
    return agg.n > 0 or agg.keys > 0 or agg.dropped > 0
end

-- The summary as the runner reads it (POST /spillway/fast-outcomes).
function _M.body(agg)
    local instances = {}
    for target, seen in pairs(agg.instances) do
        local ids = {}
        for id, cold in pairs(seen) do
            if id ~= 0 then
                ids[id] = cold
            end
        end
        instances[target] = ids
    end
    local body = {}
    for _, name in pairs(S) do
        body[name] = agg[name]
    end
    body[S.instances] = instances
    body[S.span_s] = agg.decided_from and max(0, now() - agg.decided_from) or 0
    return body
end

return _M
