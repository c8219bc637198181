-- spillway: Spillway's routing decision made inside APISIX (the fast path).
--
-- The runner (still APISIX's ext-plugin.cmd) is the brain: it compiles the policy and everything
-- load-aware into a decision table, which one worker fetches every fetch_interval_s into the
-- "spillway" shared dict. Per request this plugin does only what must be per request: one reading
-- of the request (spillway/edge.lua), residency, rules, the model, the table lookup, in-flight
-- counts against caps and spend against budgets (shared-dict counters), then the target's upstream
-- (spillway/upstream.lua), only the headers the target may receive, the signature when the target
-- wants one, and X-Spillway-Decision on the answer. Outcomes go back to the runner in batches from
-- the log phase. A table older than stale_after_s, missing or malformed makes every request local
-- (shed when the last good table said local is saturated): never a cloud decision from stale data.

local core = require("apisix.core")
local contract = require("apisix.plugins.spillway.contract")
local decide = require("apisix.plugins.spillway.decide")
local table_mod = require("apisix.plugins.spillway.table")
local sign = require("apisix.plugins.spillway.sign")
local report = require("apisix.plugins.spillway.report")
local link = require("apisix.plugins.spillway.link")
local counters = require("apisix.plugins.spillway.counters")
local edge = require("apisix.plugins.spillway.edge")
local content = require("apisix.plugins.spillway.content")
local reserve = require("apisix.plugins.spillway.reserve")
local upstream = require("apisix.plugins.spillway.upstream")
local stream = require("apisix.plugins.spillway.stream")

local ngx = ngx
local dkey = counters.key
local ffi = require("ffi")
local tonumber = tonumber
-- nginx's cached clock, read through the call resty.core.time declares rather than its ngx.now()
-- wrapper: a wrapper every module shares is one LuaJIT may stop compiling into traces (other code
-- aborting there), and each request reads the clock once.
local ffi_now = ffi.C.ngx_http_lua_ffi_now
local function ngx_now()
    return tonumber(ffi_now())
end
local tostring = tostring

local plugin_name = contract.PLUGIN
local DICT = contract.DICT
local KEY = contract.KEY
local FAIL_SAFE = contract.FAIL_SAFE
local VIA, DECISION_HEADER = contract.AUDIT.fast_path, contract.HEADER.decision
local NO_CONSUMER = "no authenticated consumer: tenants.source is consumer, so the tenant comes from "
    .. "APISIX's authentication; put an authentication plugin on this route (apisix-route --auth)"
local LOG_EVERY_S = 10

local schema = {
    type = "object",
    properties = {
        targets = { type = "array", items = { type = "string", pattern = "^[a-z][a-z0-9_-]{0,31}$" },
                    description = "this route's overflow chain" },
        rules = { type = "array", items = { type = "string", minLength = 1 },
                  description = "names of the global rules that apply here" },
        latency_target_ms = { type = "number", exclusiveMinimum = 0 },
        on_prem_only = { type = "boolean", default = false,
                         description = "nothing on this route may leave the premises" },
        content_checks = { type = "boolean", default = false,
                           description = "read the text inputs of a request that would leave: one "
                                         .. "the content detectors match stays on premises" },
        upstreams = upstream.schema,
        decision_header = { type = "boolean",
                            description = "X-Spillway-Decision on this route's answers (unset: "
                                          .. "metrics.decision_header)" },
    },
    additionalProperties = false,
}

local _M = {
    version = 0.1,
    priority = 12005,
    name = plugin_name,
    schema = schema,
}

-- This worker's view: the table as last compiled, route policies per conf, outcomes to send.
local worker = {
    attr = nil, auth = nil, tbl = nil, version = nil, policies = setmetatable({}, { __mode = "k" }),
    agg = report.new(), logged = {}, fetching = false, flushing = false,
}

local function dict()
    return ngx.shared[DICT]
end

-- The dict keys of targets' and models' counters, made anew with each table version.
local keys = counters.keys()

local function log_sometimes(kind, ...)
    local now = ngx_now()
    if (worker.logged[kind] or 0) + LOG_EVERY_S <= now then
        worker.logged[kind] = now
        core.log.warn(...)
    end
end

function _M.check_schema(conf)
    local ok, err = core.schema.check(schema, conf)
    if not ok then
        return false, err
    end
    if conf.upstreams then
        err = upstream.check(conf.upstreams)
        for _, name in ipairs(conf.targets or {}) do
            if err == nil and conf.upstreams[name] == nil then
                err = "targets names " .. name .. " but upstreams has no " .. name
            end
        end
    end
    return err == nil, err
end

-- The table as this worker last compiled it, re-read when the fetching worker stored a new one.
-- The stored version is looked at once per tick of nginx's cached clock (the requests of one
-- event-loop pass share it): a new table is seen at the next pass, as before; staleness is judged
-- by the table's own built_at on every request.
local function current(now)
    now = now or ngx_now()
    if now == worker.version_seen_at then
        return worker.tbl
    end
    worker.version_seen_at = now
    local version = dict():get(KEY.version)
    if version and version ~= worker.version then
        worker.version = version
        local tbl, err = table_mod.parse(table_mod.stored(dict()))
        if tbl then
            worker.tbl = tbl
            worker.policies = setmetatable({}, { __mode = "k" })
            keys = counters.keys()
        else
            log_sometimes("parse", "spillway: stored decision table unusable: ", err)
        end
    end
    return worker.tbl
end
_M.current = current

-- The tenant as every later read sees it: keyed when its name is long or odd. Written into the
-- view only then (a nil written would add a key to the view on every request).
local function keyed_tenant(f, header)
    local name = f.headers[header]
    local key = counters.tenant_key(name)
    if key ~= name then
        rawset(f.headers, header, key)
    end
end

local function route_policy(tbl, conf)
    local p = worker.policies[conf]
    if p == nil then
        p = content.attach(decide.route_policy(tbl, conf), tbl, conf)
        worker.policies[conf] = p
    end
    return p
end

-- What decide() reads of this node's counters, and the reservation of each decision's place.
local reserving = reserve.new(dict, function() return worker.tbl end, function() return keys end)
local live, slot, decide_and_reserve = reserving.live, reserving.slot, reserving.decide
local release_tenant = reserving.release_tenant

local function fail_safe(tbl, f, conf)
    counters.add(dict(), KEY.fail_safe, 1)
    local attr = worker.attr
    if tbl == nil then
        log_sometimes("stale", "spillway: no decision table from the runner at ", attr.runner,
                      " yet; every request stays local until one arrives")
        return { target = decide.LOCAL, reason = FAIL_SAFE, status = 0 }
    end
    log_sometimes("stale", "spillway: the decision table is ", ngx_now() - tbl.built_at,
                  " s old (stale_after_s ", attr.stale_after_s, "); every request stays local ",
                  "(shed while the last table said local is saturated) until the runner at ",
                  attr.runner, " answers")
    local policy = route_policy(tbl, conf)
    keyed_tenant(f, policy.tenant_header)
    local load = tbl["local"][f.model or ""] or tbl["local"][""] or decide.NO_LOAD
    local tenant = f.headers[policy.tenant_header]
    return decide.stay_local(load, policy, FAIL_SAFE, tenant ~= "" and tenant or nil, false)
end

-- The target's upstream from the route's upstreams (spillway/upstream.lua); a route without them
-- leaves it to traffic-split, which matches the target's value in the request's context. Only the
-- headers the target may receive go with it, and the signature when the target wants one.
local function to_cloud(ctx, conf, name, spec, raw)
    ctx.spillway_upstream = spec.value
    if conf.upstreams and not upstream.set(ctx, conf, name) then
        log_sometimes("upstream", "spillway: this route has no upstream for target ", name,
                      ": its requests go to the route's own upstream; make the route again ",
                      "(python -m gateway_plugin apisix-route --fast-path)")
    end
    edge.forward_only(raw, spec.forward_set)
    sign.request(ctx, spec)
end

-- Content checks before the decision that counts (content.lua), counted in the shared dict and
-- reported with the next fetch.
local function screen(ctx, f, tbl, policy)
    return content.screen(f, tbl, policy, live, function(max_bytes)
        return core.request.get_body(max_bytes, ctx)
    end, function(found)
        counters.add(dict(), found, 1)
    end)
end

-- Apart from screen(): a function that makes closures is one LuaJIT does not compile.
local function check_content(ctx, f, tbl, policy)
    if policy.content == nil then
        return nil
    end
    return screen(ctx, f, tbl, policy)
end


-- What the runner learns of this request: counted now, reported from the log phase.
local function account(ctx, d, f, tbl, policy, kept_by)
    local d_ = dict()
    local model_key = (tbl and f.model and tbl["local"][f.model]) and f.model or ""
    local label = decide.label(d)
    local seen = { target = d.target, label = label, decision = report.decision_text(d.target, label),
                   keys = keys, tenant = d.tenant, cost = d.cost_usd, model = model_key,
                   -- For the cost series: a model the table does not know is "*" (the runner's other).
                   usage_model = f.model and (model_key ~= "" and model_key or "*") or "",
                   -- For the audit trail, keyed only if a logger asks (spillway/edge.lua).
                   request_model = f.model,
                   -- The class the client sent (content checks may have decided on a stricter one).
                   class = kept_by and kept_by.classification
                           or (policy and f.headers[policy.classification_header]) }
    if d.target == decide.LOCAL then
        report.sent_local(worker.agg, model_key)
        if counters.add(d_, dkey(keys.local_, model_key), 1) then
            seen.local_counted = true
        end
    elseif d.target ~= decide.SHED then
        seen.cloud, seen.cold_counted, seen.streamed = true, d.cold_counted, stream.streamed(f.path)
    end
    if d.on_prem_only then
        report.on_prem(worker.agg, model_key)
    end
    if d.residency_kept then
        local classification = kept_by and kept_by.classification
            or (policy and f.headers[policy.classification_header])
        report.kept_home(worker.agg, { path = ctx.var.uri, model = f.model,
                                       classification = classification,
                                       content = kept_by and kept_by.label })
    end
    if tbl and policy and d.reason ~= FAIL_SAFE then
        local load = tbl["local"][model_key] or decide.NO_LOAD
        if (d.overflowing or false) ~= load.overflowing then
            d_:safe_set(dkey(keys.hot, model_key), d.overflowing or false)
        end
        seen.tenant_counted = d.tenant ~= nil and d.target ~= decide.SHED
                              and decide.quota_limits(policy, d.tenant)
        if seen.tenant_counted then report.tenant(worker.agg, d.tenant, 1, d.cost_usd or 0) end
    end
    ctx.spillway = seen
end

-- In the access phase: after APISIX authenticated the request (its auth plugins run in rewrite)
-- and before the upstream is picked (traffic-split, priority 966, on a route without upstreams).
function _M.access(conf, ctx)
    local raw, path, odd = edge.admit(ctx)
    if not raw then
        ctx.spillway_refused, ctx.spillway_via = path, VIA
        return path, { error = odd }
    end
    edge.read_body()  -- before anything is counted: a slow client holds nothing meanwhile
    local now = ngx_now()
    local tbl = current(now)
    local policy
    local f = decide.features(path, raw, core.request.get_uri_args, ctx)
    if tbl then
        policy = route_policy(tbl, conf)
        local status, why = edge.settle(ctx, raw, odd, policy.read, policy.tenant_header)
        if status then
            ctx.spillway_refused, ctx.spillway_via = status, VIA
            return status, { error = why }
        end
        if not edge.identify(ctx, raw, f.headers, policy) then
            ctx.spillway_refused, ctx.spillway_via = 401, VIA
            return 401, { error = NO_CONSUMER }
        end
    end
    local d, kept_by
    if tbl == nil or now - tbl.built_at > worker.attr.stale_after_s then
        d = fail_safe(tbl, f, conf)
        policy = nil
    else
        keyed_tenant(f, policy.tenant_header)
        local reserved = reserving.tenant(f, policy, log_sometimes)
        kept_by = check_content(ctx, f, tbl, policy)
        if kept_by and kept_by.refusal then  -- Triton would read the body otherwise: a duplicate key
            slot.tenant = nil
            if reserved then release_tenant(reserved) end
            ctx.spillway_refused, ctx.spillway_via = 400, VIA
            return 400, { error = kept_by.refusal }
        end
        d = decide_and_reserve(f, tbl, policy)
        slot.tenant = nil
        if reserved and d.target == decide.SHED then
            release_tenant(reserved)
            reserved = nil
        end
        ctx.spillway_slot = reserved
    end
    account(ctx, d, f, tbl, policy, kept_by)
    if tbl then
        ctx.spillway.table_age_s = math.max(0, now - tbl.built_at)
    end
    if d.reason == contract.REASON.admission_invalid then
        return d.status, { error = "bad request (" .. ctx.spillway.label .. "): "
                                   .. decide.invalid_message(policy) }
    end
    if d.target == decide.SHED then
        core.response.set_header("Retry-After", tostring(d.retry_after_s))
        return d.status, { error = "overloaded (" .. ctx.spillway.label .. "); retry after "
                                   .. d.retry_after_s .. " s" }
    end
    edge.pin_path(ctx)
    if d.target == decide.LOCAL then
        return
    end
    local spec = tbl.targets[d.target]
    ctx.spillway.value, ctx.spillway.price = spec.value, spec.stream_usd
    to_cloud(ctx, conf, d.target, spec, raw)
end

function _M.header_filter(conf, ctx)
    local seen = ctx.spillway
    if not seen then
        return
    end
    local show = conf.decision_header
    if show == nil then
        show = worker.tbl == nil or worker.tbl.decision_header ~= false
    end
    if show then
        ngx.header[DECISION_HEADER] = seen.decision
    end
    if seen.streamed then
        stream.start(ctx)
    end
end

-- A stream sent to a target: its events, counted for its bill (spillway/stream.lua).
function _M.body_filter(conf, ctx)
    stream.count(ctx)
end

function _M.log(conf, ctx)
    local seen = ctx.spillway
    if not seen then
        return
    end
    local d_ = dict()
    if seen.cloud then
        if seen.streamed then
            local seconds = report.last_number(ngx.var.upstream_response_time)
            local more = stream.settle(d_, seen, ctx, seconds, worker.attr.report_delay_s)
            if more ~= 0 and seen.tenant_counted then report.tenant(worker.agg, seen.tenant, 0, more) end
        end
        counters.release(d_, dkey(seen.keys.inflight, seen.target))
        if seen.cold_counted then
            counters.release(d_, dkey(seen.keys.cold, seen.target))
        end
    elseif seen.local_counted then
        counters.release(d_, dkey(seen.keys.local_, seen.model))
    end
    if ctx.spillway_slot then
        release_tenant(ctx.spillway_slot)  -- an idle tenant's key expires rather than racing a delete
    end
    -- nginx's variables as they are: APISIX's ctx.var would test seven prefixes on each name first.
    report.add(worker.agg, seen, ngx.var, ngx.status)
end

local started = false

function _M.init()
    local attr, auth = link.settings()
    if not attr then
        return
    end
    worker.attr, worker.auth = attr, auth
    if ngx.shared[DICT] == nil then
        core.log.error("spillway: no lua_shared_dict named ", DICT, "; add ",
                       "nginx_config.http.custom_lua_shared_dict: {spillway: 10m} to config.yaml")
        return
    end
    counters.node(dict())
    link.watch(attr, auth, dict())
    if started or ngx.get_phase() ~= "init_worker" then
        return
    end
    started = true
    link.start(worker, { dict = dict, current = current, log_sometimes = log_sometimes })
end

return _M
