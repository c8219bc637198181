-- The runner's decision table: checked and compiled once per version, kept per worker.
--
-- One worker fetches it (POST with this node's counters, so the runner learns what the fast path
-- spent and sent local) and stores the JSON in the shared dict; every worker compiles a new
-- version the first time a request sees it. A table that does not decode, has the wrong shape,
-- or carries a rule pattern PCRE cannot compile is refused: the last good one stays, ageing
-- towards stale.

local cjson = require("cjson.safe")
local detect = require("apisix.plugins.spillway.detect")
local re_find = ngx.re.find
local type, pairs, ipairs, tonumber = type, pairs, ipairs, tonumber

local _M = { FORMAT = 4 }

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
end

local function target_ok(t)
    return type(t) == "table" and is_num(t.cap) and is_num(t.slots) and is_num(t.idle_usd)
        and is_num(t.cold_start_ms)
        and is_num(t.cost_usd)
        and is_num(t.cold_cost_usd) and BREAKERS[t.breaker] and is_bool(t.probe_allowed)
        and is_num(t.warm) and is_num(t.spent_hour_usd) and is_num(t.spent_day_usd)
        and is_num(t.spent_mark) and is_bool(t.invoke) and opt_num(t.hourly_usd)
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
        and is_num(p.max_queue_ms) and is_num(p.enter_ratio) and is_num(p.exit_ratio)
        and is_num(p.saturation_ratio) and is_num(p.retry_after_s) and is_num(p.parallelism)
        and is_num(p.onprem_headroom)
        and list_of(p.default_chain, is_str) and list_of(p.rules, rule_ok)
end

-- Why a decoded table cannot be used (nil when it can).
function _M.problem(t)
    if type(t) ~= "table" then
        return "not a JSON object"
    end
    if t.format ~= _M.FORMAT then
        return "format " .. tostring(t.format) .. ", this plugin reads format " .. _M.FORMAT
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

local function set_of(list)
    local s = {}
    for _, v in ipairs(list) do
        s[v] = true
    end
    return s
end

-- A checked table made ready for decide(): sets for membership tests.
function _M.compile(t)
    local p = t.policy
    p.cloud_allowed_set = set_of(p.cloud_allowed)
    for _, r in ipairs(p.rules) do
        if #r.models > 0 then
            r.models_set = set_of(r.models)
        end
    end
    for _, target in pairs(t.targets) do
        target.forward_set = set_of(target.forward)
    end
    local c = t.content
    c.rules_set = set_of(c.rules)
    c.names = {}
    for _, d in ipairs(c.detectors) do
        c.names[d.name] = true
    end
    return t
end

-- Where the table lives in the shared dict. A dict's safe_set of a value whose size differs from
-- the stored one frees the old value before it allocates the new: when that fails (the dict is
-- shared with counters clients can multiply, a tenant's in-flight count each), the last good table
-- would be gone too, and every worker would go stale and fail safe, which sheds all traffic while
-- the last table said local is saturated. So the table is padded (JSON allows trailing spaces) to
-- a size class, a power of two from 64 KiB, and kept under a key named by its class:
--  * a table that fits the class is written over the last one in place: the same size, so no
--    allocation, it cannot fail for want of memory and evicts nothing;
--  * a larger one is stored under the next class's key first, and the class switched and the old
--    key freed only once it is there, so a growth that finds no room leaves the last good table
--    where it was, still served until a smaller one (the runner leaves tenant rows out to fit the
--    room the plugin reports) replaces it in place.
-- Nothing else is ever evicted (safe_set), and a table read half-written is impossible (a dict
-- operation holds the dict's lock).
local KEY, CLASS_KEY, MIN_CLASS = "table:", "table_class", 65536

-- The class pointer is made at start, while the dict has room; updating a number is in place.
function _M.prepare(d_)
    d_:safe_add(CLASS_KEY, 0)
end

-- The stored table's text (padded), nil when there is none.
function _M.stored(d_)
    for _ = 1, 2 do  -- a second look when the table grew into the next class meanwhile
        local class = d_:get(CLASS_KEY)
        if not class or class == 0 then
            return nil
        end
        local text = d_:get(KEY .. class)
        if text then
            return text
        end
    end
    return nil
end

local function class_for(bytes)
    local class = MIN_CLASS
    while class < bytes do
        class = class * 2
    end
    return class
end

local function padded(text, class)
    return text .. string.rep(" ", class - #text)
end

-- Store a table's text; true, or false with the error and the room: the most a table may take
-- to be stored in place of the last one.
function _M.store(d_, text)
    local class = d_:get(CLASS_KEY) or 0
    if #text <= class then
        local ok, err = d_:safe_set(KEY .. class, padded(text, class))
        return ok, err, class
    end
    local grown = class_for(#text)
    local ok, err = d_:safe_set(KEY .. grown, padded(text, grown))
    if not ok then
        return false, err, class
    end
    local switched, switch_err = d_:safe_set(CLASS_KEY, grown)
    if not switched then
        d_:delete(KEY .. grown)
        return false, switch_err, class
    end
    if class > 0 then
        d_:delete(KEY .. class)
    end
    return true
end

-- Decode, check and compile; nil and the reason when the text is unusable.
function _M.parse(text)
    local t, err = cjson.decode(text)
    if t == nil then
        return nil, "not JSON: " .. tostring(err)
    end
    local problem = _M.problem(t)
    if problem then
        return nil, problem
    end
    return _M.compile(t)
end

return _M
