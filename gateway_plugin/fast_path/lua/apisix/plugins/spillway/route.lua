-- What one route decides under and from: its policy (the table's, with the route's overrides) and
-- a request's features as the runner builds them. Kept apart from decide.lua, the decision itself.

local type, ipairs, rawget, rawset, setmetatable = type, ipairs, rawget, rawset, setmetatable
local str_sub, str_find = string.sub, string.find

local _M = {}

-- The route's overrides over the table's policy, as request/spillway.py's _route_policy.
function _M.route_policy(tbl, conf)
    local base = tbl.policy
    local p = setmetatable({}, { __index = base })
    if conf.latency_target_ms then
        p.latency_target_ms = conf.latency_target_ms
    end
    if conf.targets then
        local chain = {}
        for _, name in ipairs(conf.targets) do
            if tbl.targets[name] then
                chain[#chain + 1] = name
            end
        end
        p.default_chain = chain
    end
    if conf.rules then
        local wanted, rules = {}, {}
        for _, name in ipairs(conf.rules) do
            wanted[name] = true
        end
        for _, r in ipairs(base.rules) do
            if wanted[r.name] then
                rules[#rules + 1] = r
            end
        end
        p.rules = rules
    end
    if conf.on_prem_only then
        p.cloud_allowed_set = {}
        p.unclassified_may_leave = false
    end
    -- The headers a decision under this policy reads (request_reading.read_headers).
    p.read = { [p.classification_header] = true }
    if not p.tenant_from_consumer then
        p.read[p.tenant_header] = true
    end
    for _, h in ipairs({ p.deadline_header, p.priority_header }) do
        if h ~= "" then
            p.read[h] = true
        end
    end
    for _, r in ipairs(p.rules) do
        for _, h in ipairs(r.headers) do
            p.read[h[1]] = true
        end
    end
    return p
end

-- A request's features as the runner builds them (request/spillway.py): the checked path,
-- the model from it, headers with repeated ones joined by ", ", arguments (the last value of a
-- repeated one; none without "=" reads "").
local RAW, LOAD, SOURCE = {}, {}, {}  -- keys no header or argument name can be

local JOINED = { __index = function(view, name)
    local v = rawget(view, RAW)[name]
    if type(v) == "table" then
        return table.concat(v, ", ")
    end
    return v
end }

-- Arguments are read from nginx only when a rule asks for one.
local LAST = { __index = function(view, name)
    local raw = rawget(view, RAW)
    if raw == nil then
        raw = rawget(view, LOAD)(rawget(view, SOURCE))
        rawset(view, RAW, raw)
    end
    local v = raw[name]
    if type(v) == "table" then
        v = v[#v]
    end
    if v == true then
        return ""
    end
    return v
end }

-- path:match("^/v2/models/([^/]+)") without a pattern (LuaJIT compiles none).
local function model_of(path)
    if str_sub(path, 1, 11) == "/v2/models/" then
        local model = str_sub(path, 12, (str_find(path, "/", 12, true) or 0) - 1)
        return model ~= "" and model or nil
    end
end

-- path: the request's path as the edge checked it (edge.gateway_path); args_of(source) gives the
-- argument table, called at most once and only if a rule needs it.
function _M.features(path, raw_headers, args_of, source)
    return {
        path = path,
        model = model_of(path),
        headers = setmetatable({ [RAW] = raw_headers }, JOINED),
        args = setmetatable({ [LOAD] = args_of, [SOURCE] = source }, LAST),
    }
end

return _M
