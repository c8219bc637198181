-- Bench-only plugin (bench/table_check.py): what checking one decision table costs a worker, the
-- plugin's own table.parse (decode, core.schema.check against the generated schema, PCRE
-- compiles, compile) against the baseline, the hand-written checks table.lua had before the
-- schema (copied below as they were at commit 358eb5a), interleaved parse by parse.

local core = require("apisix.core")
local cjson = require("cjson.safe")
local table_mod = require("apisix.plugins.spillway.table")
local re_find = ngx.re.find
local type, pairs, os_clock = type, pairs, os.clock
local detect = { KINDS = { card = true, iban = true, search = true, pattern = true } }
local FORMAT = table_mod.FORMAT

local _M = { version = 0.1, priority = 500, name = "spillway-table-check", schema = { type = "object" } }

function _M.check_schema(conf)
    return core.schema.check(_M.schema, conf)
end

-- The baseline: the hand-written checks, verbatim.
local problem
do

    local ACTIONS = { ["local"] = true, overflow = true, target = true, shed = true }
    local BREAKERS = { closed = true, open = true, half_open = true }

    local function is_num(v) return type(v) == "number" and v == v and v > -math.huge and v < math.huge end
    local function is_str(v) return type(v) == "string" end
    local function is_bool(v) return type(v) == "boolean" end
    local function opt_num(v) return v == nil or is_num(v) end

    local function list_of(v, check)
        if type(v) ~= "table" then
            return false
        end
        for k, item in pairs(v) do
            if type(k) ~= "number" or not check(item) then
                return false
            end
        end
        return true
    end

    local function map_of(v, check)
        if type(v) ~= "table" then
            return false
        end
        for k, item in pairs(v) do
            if type(k) ~= "string" or not check(item) then
                return false
            end
        end
        return true
    end

    local function regex_ok(pattern, full)
        if not is_str(pattern) then
            return false
        end
        local p = full and ("\\A(?:" .. pattern .. ")\\z") or pattern
        local _, _, err = re_find("", p, "jo")
        return err == nil
    end

    local function pair_ok(full)
        return function(p)
            return type(p) == "table" and is_str(p[1]) and regex_ok(p[2], full)
        end
    end

    local function quota_ok(q)
        return type(q) == "table" and opt_num(q.requests_per_minute) and opt_num(q.concurrency)
            and opt_num(q.hourly_usd) and opt_num(q.daily_usd)
    end

    local function rule_ok(r)
        return type(r) == "table" and is_str(r.name) and ACTIONS[r.action]
            and list_of(r.targets, is_str) and list_of(r.models, is_str)
            and list_of(r.headers, pair_ok(true)) and list_of(r.args, pair_ok(true))
            and (r.uri == nil or regex_ok(r.uri, false))
    end

    local function load_ok(l)
        return type(l) == "table" and is_bool(l.fresh) and is_num(l.latency_ms) and is_num(l.backlog_ms)
            and is_num(l.compute_ms) and is_bool(l.overflowing) and is_num(l.onprem_rps)
            and is_bool(l.gauges_hot) and is_bool(l.failing) and is_bool(l.probe_allowed)
    end

    local function target_ok(t)
        return type(t) == "table" and is_num(t.cap) and is_num(t.slots) and is_num(t.idle_usd)
            and is_num(t.cold_start_ms)
            and is_num(t.cost_usd)
            and is_num(t.cold_cost_usd) and BREAKERS[t.breaker] and is_bool(t.probe_allowed)
            and is_num(t.warm) and is_num(t.spent_hour_usd) and is_num(t.spent_day_usd)
            and is_num(t.spent_mark) and is_num(t.given_back_mark) and list_of(t.stream_usd, is_num)
            and is_bool(t.invoke) and opt_num(t.hourly_usd)
            and opt_num(t.daily_usd) and opt_num(t.max_request_bytes) and (t.invoke or is_str(t.value))
            and (t.key_env == nil or is_str(t.key_env)) and list_of(t.forward, is_str)
    end

    local function tenant_ok(t)
        return type(t) == "table" and is_num(t.requests_last_minute) and is_num(t.spent_hour_usd)
            and is_num(t.spent_day_usd)
    end

    local function detector_ok(d)
        return type(d) == "table" and is_str(d.name) and detect.KINDS[d.kind]
            and ((d.kind ~= "search" and d.kind ~= "pattern") or regex_ok(d.pattern, false))
    end

    local function content_ok(c)
        return type(c) == "table" and list_of(c.detectors, detector_ok) and is_num(c.max_bytes)
            and is_bool(c.unscannable_stays) and is_str(c.classify_as) and list_of(c.rules, is_str)
    end

    local function policy_ok(p)
        return type(p) == "table" and is_str(p.classification_header) and list_of(p.cloud_allowed, is_str)
            and is_bool(p.unclassified_may_leave) and is_str(p.tenant_header)
            and is_bool(p.tenant_from_consumer) and map_of(p.consumer_ceilings, is_str)
            and map_of(p.quotas, quota_ok) and quota_ok(p.default_quota)
            and is_num(p.latency_target_ms) and map_of(p.model_targets_ms, is_num)
            and map_of(p.model_ttft_ms, is_num)
            and is_num(p.max_queue_ms) and is_num(p.enter_ratio) and is_num(p.exit_ratio)
            and is_num(p.saturation_ratio) and is_num(p.retry_after_s) and is_num(p.parallelism)
            and is_num(p.onprem_headroom)
            and list_of(p.default_chain, is_str) and list_of(p.rules, rule_ok)
    end

    -- Why a decoded table cannot be used (nil when it can).
    problem = function(t)
        if type(t) ~= "table" then
            return "not a JSON object"
        end
        if t.format ~= FORMAT then
            return "format " .. tostring(t.format) .. ", this plugin reads format " .. FORMAT
        end
        if not is_num(t.version) or not is_num(t.built_at) or not is_bool(t.decision_header) then
            return "version, built_at or decision_header missing"
        end
        if not policy_ok(t.policy) then
            return "policy section malformed (or a rule pattern PCRE does not compile)"
        end
        if not content_ok(t.content) then
            return "content section malformed (or a detector's pattern PCRE does not compile)"
        end
        if not map_of(t["local"], load_ok) then
            return "local section malformed"
        end
        if not map_of(t.targets, target_ok) then
            return "targets section malformed"
        end
        if not map_of(t.tenants, tenant_ok) then
            return "tenants section malformed"
        end
        return nil
    end
end

local function baseline(text)
    local t = cjson.decode(text)
    if problem(t) then
        return nil
    end
    return table_mod.compile(t)
end

-- POST {"table": text, "rounds": n}: each parse's CPU microseconds, both ways.
function _M.access()
    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if not body then  -- a large body waits in a file
        local f = io.open(ngx.req.get_body_file(), "rb")
        body = f:read("*a")
        f:close()
    end
    local req = cjson.decode(body)
    local text, rounds = req.table, req.rounds
    local new, old = {}, {}
    for i = 1, rounds do
        local start = os_clock()
        local ok = table_mod.parse(text) ~= nil
        new[i] = (os_clock() - start) * 1e6
        start = os_clock()
        local base_ok = baseline(text) ~= nil
        old[i] = (os_clock() - start) * 1e6
        if not ok or not base_ok then
            return 500, { error = "a table was refused", schema = ok, baseline = base_ok }
        end
    end
    return 200, { schema = new, baseline = old }
end

return _M
