-- Residency by content on the fast path: gateway_plugin/routing/content.py in Lua.
--
-- On a route whose conf has content_checks, or for a request whose deciding rule has it, a request
-- the table would send out has its text inputs read first: the elements of every BYTES tensor's
-- data and the string values of the request's, each input's and each output's parameters, from
-- the JSON body or the JSON header of a binary-tensor body (Inference-Header-Content-Length bytes).
-- When a detector (detect.lua) finds something, the request is decided as content.classify_as, a
-- class that may not leave: a match only ever keeps a request home. A body that cannot be read
-- (over max_bytes, of unknown size, not JSON, text in binary tensors) stays home unless the config
-- says to decide it by its label; a scan that ran past its CPU budget (budget_ms, from the read
-- body on: nothing in it yields) stays home whatever the config says.
--
-- The body is read exactly as the runner reads it: UTF-8 only (PCRE's validity check), no NUL
-- byte, strict JSON (cjson with invalid numbers refused, plus the "1." and "-.5" forms cjson lets
-- through and Python's json does not), at most MAX_DEPTH levels, an object at the top.

local cjson = require("cjson.safe").new()
local contract = require("apisix.plugins.spillway.contract")
local decide = require("apisix.plugins.spillway.decide")
local detect = require("apisix.plugins.spillway.detect")

local re_find = ngx.re.find
local find, sub = string.find, string.sub
local type, pairs, ipairs, getmetatable, tonumber = type, pairs, ipairs, getmetatable, tonumber

local PREFIX, WHY = contract.PREFIX, contract.UNSCANNABLE
local _M = { HEADER_JSON_LENGTH = "inference-header-content-length", MAX_DEPTH = 32 }

cjson.decode_array_with_array_mt(true)
cjson.decode_max_depth(_M.MAX_DEPTH)
cjson.decode_invalid_numbers(false)
local ARRAY = cjson.array_mt

-- Outside strings, a '.' not followed by a digit or a '-' followed by a '.': numbers cjson reads
-- (through strtod) and JSON does not allow.
local LOOSE_NUMBER = [=[\A(?:[^".-]++|"(?:[^"\\]++|\\.)*+"|-(?!\.)|\.(?=[0-9]))*+[.-]]=]

local function is_list(v)
    return type(v) == "table" and getmetatable(v) == ARRAY
end

local function is_object(v)
    return type(v) == "table" and getmetatable(v) ~= ARRAY
end

-- The JSON object text holds; nil when it holds none.
local function document(text)
    if find(text, "\0", 1, true) then
        return nil
    end
    local valid = re_find(text, "^", "ju")
    if not valid then
        return nil
    end
    local doc = cjson.decode(text)
    if not is_object(doc) or re_find(text, LOOSE_NUMBER, "jos") then
        return nil
    end
    return doc
end
_M.document = document

-- The JSON part of the body: all of it, or the header's count of bytes; nil when that header is
-- not a size within the body.
local function json_header(body, json_length)
    if json_length == nil then
        return body
    end
    local value = json_length:match("^[ \t]*(.-)[ \t]*$")
    if not value:find("^[0-9]+$") then
        return nil
    end
    local n = tonumber(value)
    if n > #body then
        return nil
    end
    return sub(body, 1, n)
end

local function parameters(owner, texts)
    local p = owner.parameters
    if is_object(p) then
        for _, v in pairs(p) do
            if type(v) == "string" then
                texts[#texts + 1] = v
            end
        end
    end
end

local function strings(data, texts)
    if type(data) == "string" then
        texts[#texts + 1] = data
    elseif is_list(data) then
        for _, item in ipairs(data) do
            strings(item, texts)
        end
    end
end

-- The text inputs of a KServe v2 request, and whether a BYTES tensor holds its text in the
-- binary part (which is not read).
local function text_inputs(doc)
    local texts, binary_text = {}, false
    parameters(doc, texts)
    if is_list(doc.inputs) then
        for _, tensor in ipairs(doc.inputs) do
            if is_object(tensor) then
                parameters(tensor, texts)
                if tensor.datatype == "BYTES" then
                    local p = tensor.parameters
                    if is_object(p) and p.binary_data_size ~= nil then
                        binary_text = true
                    end
                    strings(tensor.data, texts)
                end
            end
        end
    end
    if is_list(doc.outputs) then
        for _, tensor in ipairs(doc.outputs) do
            if is_object(tensor) then
                parameters(tensor, texts)
            end
        end
    end
    return texts, binary_text
end

-- What reading the request's text found: the first detector that matched, or why it could not
-- be read (both nil: read, nothing found). read_body() gives the body, called only when its
-- declared size is within max_bytes.
function _M.verdict(c, headers, read_body)
    local declared = decide.body_bytes(headers)
    if declared == nil then
        return nil, WHY.unknown_size
    end
    if declared > c.max_bytes then
        return nil, WHY.too_large
    end
    if declared == 0 then
        return nil, nil
    end
    local body = read_body(c.max_bytes) or ""
    if #body > c.max_bytes then
        return nil, WHY.too_large
    end
    local budget = detect.budget(c.budget_ms)
    local header = json_header(body, headers[_M.HEADER_JSON_LENGTH])
    local doc = header and document(header)
    if not doc then
        return nil, WHY.not_json
    end
    local texts, binary_text = text_inputs(doc)
    if detect.read(budget, #body) then
        return nil, WHY.over_budget
    end
    local found, over = detect.first_found(c.detectors, texts, budget)
    if found or over then
        return found, over and WHY.over_budget
    end
    return nil, binary_text and WHY.binary_text or nil
end

-- Whether what reading found keeps the request home: a match, or text it could not read (a scan
-- over budget always; the rest unless the config decides them by their label).
local function stays(c, found, why)
    return found ~= nil or (why ~= nil and (c.unscannable_stays or why == WHY.over_budget))
end
_M.stays = stays

-- The route's policy (decide.route_policy) given what content checks it has: every request
-- (content_checks in the route's conf) or those of the rules that ask; the header that locates
-- a binary body's JSON is then one a decision reads, settled to one value like the others.
function _M.attach(p, tbl, conf)
    local c = tbl.content
    local rules, any = {}, false
    for _, r in ipairs(p.rules) do
        if c.rules_set[r.name] then
            rules[r.name], any = true, true
        end
    end
    if not conf.content_checks and not any then
        return p
    end
    p.content = { c = c, every_request = conf.content_checks == true, rules = rules }
    p.read[_M.HEADER_JSON_LENGTH] = true
    return p
end

-- Whether this request's text is read: the route asks, or its deciding rule does.
function _M.applies(p, f)
    local checks = p.content
    if checks == nil then
        return false
    end
    if checks.every_request then
        return true
    end
    for _, r in ipairs(p.rules) do
        if decide.rule_matches(r, f) then
            return checks.rules[r.name] == true
        end
    end
    return false
end

-- Before the decision that counts: a request the table would send out is read, and decided as a
-- class that may not leave when what was found keeps it home. Returns what was found (a detector's
-- name), why the text was unreadable, and true; nothing when it was not read.
function _M.check(f, tbl, policy, live, read_body)
    if not _M.applies(policy, f) then
        return nil
    end
    local probe = decide.decide(f, tbl, policy, live)
    if probe.target == decide.LOCAL or probe.target == decide.SHED then
        return nil
    end
    local c = policy.content.c
    local found, why = _M.verdict(c, f.headers, read_body)
    if stays(c, found, why) then
        rawset(f.headers, policy.classification_header, c.classify_as)
    end
    return found, why, true
end

-- check(), with what it found counted (count(key): "cm:<detector>" or "cu:<reason>"). When it
-- kept the request home: what the residency log names (the detector, never the text) and the
-- class the request was sent with, before the one it is decided as.
function _M.screen(f, tbl, policy, live, read_body, count)
    if policy.content == nil then
        return nil
    end
    local sent = f.headers[policy.classification_header]
    local found, why, read = _M.check(f, tbl, policy, live, read_body)
    if not read then
        return nil
    end
    if found or why then
        count(found and (PREFIX.content_match .. found) or (PREFIX.content_unscannable .. why))
    end
    if stays(policy.content.c, found, why) then
        return { label = _M.label(found, why), classification = sent }
    end
    return nil
end

-- The label the residency log shows (never the text).
function _M.label(found, why)
    if found then
        return found
    end
    return why and ("unscannable:" .. why) or nil
end

_M.UNSCANNABLE = {}
for _, reason in pairs(WHY) do
    _M.UNSCANNABLE[reason] = true
end
return _M
