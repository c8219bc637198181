-- The runner's decision table: checked and compiled once per version, kept per worker.
--
-- One worker fetches it (POST with this node's counters, so the runner learns what the fast path
-- spent and sent local) and stores the JSON in the shared dict; every worker compiles a new
-- version the first time a request sees it. A table that does not decode, has the wrong shape,
-- or carries a rule pattern PCRE cannot compile is refused: the last good one stays, ageing
-- towards stale.

local core = require("apisix.core")
local contract = require("apisix.plugins.spillway.contract")
local schema = require("apisix.plugins.spillway.table_schema")
local detect = require("apisix.plugins.spillway.detect")
local re_find = ngx.re.find
local type, pairs, ipairs = type, pairs, ipairs

-- NaN and Infinity are not JSON (the schema bounds what 1e999 reads as).
local cjson = require("cjson.safe").new()
cjson.decode_invalid_numbers(false)

local _M = { FORMAT = contract.FORMAT }

-- What a schema cannot say: every pattern compiles in PCRE (a rule's uri as a search, its headers'
-- and args' as whole-value matches, a search detector's), every operator pattern's program is
-- well formed (detect.compile), and a cloud target that is not invoke-mode names the value
-- traffic-split matches.
local function regex_ok(pattern, full)
    local p = full and ("\\A(?:" .. pattern .. ")\\z") or pattern
    local _, _, err = re_find("", p, "jo")
    return err == nil
end

local function pairs_ok(list)
    for _, p in ipairs(list) do
        if not regex_ok(p[2], true) then
            return false
        end
    end
    return true
end

local function patterns_problem(t)
    for _, r in ipairs(t.policy.rules) do
        if not pairs_ok(r.headers) or not pairs_ok(r.args) or (r.uri ~= nil and not regex_ok(r.uri, false)) then
            return "policy section malformed (a rule pattern PCRE does not compile)"
        end
    end
    for _, d in ipairs(t.content.detectors) do
        if d.kind == "search" and (type(d.pattern) ~= "string" or not regex_ok(d.pattern, false)) then
            return "content section malformed (a detector's pattern PCRE does not compile)"
        end
    end
    if not detect.compile(t.content.detectors) then
        return "content section malformed (an operator pattern's program is malformed)"
    end
    for name, target in pairs(t.targets) do
        if not target.invoke and target.value == nil then
            return "targets section malformed (" .. name .. " has no value and is not invoke-mode)"
        end
    end
    return nil
end

-- Why a decoded table cannot be used (nil when it can).
function _M.problem(t)
    if type(t) ~= "table" then
        return "not a JSON object"
    end
    if t.format ~= _M.FORMAT then
        return "format " .. tostring(t.format) .. ", this plugin reads format " .. _M.FORMAT
    end
    local ok, err = core.schema.check(schema, t)
    if not ok then
        return "not a decision table: " .. tostring(err)
    end
    return patterns_problem(t)
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
local KEY, CLASS_KEY, MIN_CLASS = contract.PREFIX.table, contract.KEY.table_class, 65536

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
