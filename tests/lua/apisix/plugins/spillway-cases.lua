-- Test-only plugin: evaluates batches of equivalence cases with the spillway plugin's own code
-- (edge.gateway_path, table.parse, decide.route_policy, decide.features, content.check,
-- decide.decide, stream.streamed, stream.counted, stream.settled), so one request to APISIX checks thousands of
-- decisions. Each group carries a decision table as the runner encodes it and the cases to decide
-- under it; each case its route conf, request (with its body, base64) and live counters. A group
-- of chunks instead is a stream's body, whose events are counted; a group of rows to settle,
-- streams' bills against their held prices.
local core = require("apisix.core")
local decide = require("apisix.plugins.spillway.decide")
local table_mod = require("apisix.plugins.spillway.table")
local edge = require("apisix.plugins.spillway.edge")
local content = require("apisix.plugins.spillway.content")
local stream = require("apisix.plugins.spillway.stream")
local json = require("cjson").new()
-- Costs go back as "%.17g" text: this cjson writes at most 16 significant digits.

local _M = { version = 0.1, priority = 500, name = "spillway-cases", schema = { type = "object" } }

function _M.check_schema(conf)
    return core.schema.check(_M.schema, conf)
end

local function live_of(case)
    local live = {}
    function live.in_flight(_, name) return case.in_flight[name] or 0 end
    function live.spent() return 0 end
    function live.tenant_in_flight(_, tenant) return case.tenant_in_flight[tenant] or 0 end
    function live.probe_allowed(_, _, spec) return spec.probe_allowed end
    function live.local_in_flight(_, model_key) return case.local_in_flight[model_key] end
    function live.starting(_, name) return case.starting[name] or 0 end
    function live.local_probe_allowed() return true end
    return live
end

-- As the plugin's access phase: the route's policy with its content checks, the text read (from
-- the case's body) when the request would leave, then the decision.
local function decide_one(tbl, case, path)
    local f = decide.features(path, case.headers, function(c) return c.args end, case)
    local policy = content.attach(decide.route_policy(tbl, case.route), tbl, case.route)
    local live = live_of(case)
    local body = ngx.decode_base64(case.body)
    local found, why, read, refusal = content.check(f, tbl, policy, live, function() return body end)
    local d = decide.decide(f, tbl, policy, live)
    return {
        read = read or false, content = read and content.label(found, why, refusal) or json.null,
        target = d.target, label = decide.label(d), status = d.status,
        retry_after_s = d.retry_after_s or 0, cost_usd = string.format("%.17g", d.cost_usd or 0),
        residency_kept = d.residency_kept or false, overflowing = d.overflowing or false,
        tenant = d.tenant or json.null, on_prem_only = d.on_prem_only or false,
        streamed = stream.streamed(path),
    }
end

-- A stream's body in chunks, counted as the plugin's body_filter counts it.
local function count_events(chunks)
    local count, tail = 0, ""
    for _, chunk in ipairs(chunks) do
        count, tail = stream.counted(count, tail, ngx.decode_base64(chunk))
    end
    return { count = count }
end

-- Streams settled: each row the held price, the bill, when it was held, when settled, and how
-- long until the runner takes the settlement in.
local function settle_all(rows)
    local out = {}
    for i, row in ipairs(rows) do
        local spent, given_back = stream.settled(row[1], row[2], row[3], row[4], row[5])
        out[i] = { string.format("%.17g", spent), string.format("%.17g", given_back) }
    end
    return { settled = out }
end

local function evaluate(group)
    if group.chunks then
        return count_events(group.chunks)
    end
    if group.settle then
        return settle_all(group.settle)
    end
    local tbl, err = table_mod.parse(group.table)
    if not tbl then
        return { error = err }
    end
    local out = {}
    for i, case in ipairs(group.cases) do
        local path = edge.gateway_path(case.uri)
        if path then
            out[i] = decide_one(tbl, case, path)
        else
            out[i] = { refused = true }
        end
    end
    return { results = out }
end

function _M.access(conf, ctx)
    local body, err = core.request.get_body(256 * 1024 * 1024, ctx)
    if not body then
        return 400, { error = "no batch: " .. tostring(err) }
    end
    local batch = json.decode(body)
    local answers = {}
    for i, group in ipairs(batch) do
        answers[i] = evaluate(group)
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.say(json.encode(answers))
    return ngx.exit(200)
end

return _M
