-- Residency by content on the fast path: gateway_plugin/content/checks.py in Lua.
--
-- On a route whose conf has content_checks, or for a request whose deciding rule has it, a request
-- the table would send out has its text inputs read first: every string at any depth in a BYTES
-- tensor's data and in the request's, each input's and each output's parameters (names too), from
-- the JSON body or a binary-tensor body's JSON header (Inference-Header-Content-Length bytes). When
-- a detector (detect.lua) finds something, the request is decided as content.classify_as, a class
-- that may not leave: a match only ever keeps a request home. A body that cannot be read (over
-- max_bytes, of unknown size, not JSON, text in binary tensors, bytes other than the inputs'
-- binary_data_size declare) stays home unless the config decides it by its label; a scan past its
-- CPU budget (budget_ms) stays home whatever the config says. A body with a key twice in one
-- object is refused (400): Triton reads the first, cjson the last.
--
-- The body is read exactly as the runner reads it: UTF-8 only (PCRE's validity check), no NUL
-- byte, strict JSON (cjson with invalid numbers refused, plus the "1." and "-.5" forms cjson lets
-- through and Python's json does not), at most MAX_DEPTH levels, an object at the top.

local cjson = require("cjson.safe").new()
local contract = require("apisix.plugins.spillway.contract")
local decide = require("apisix.plugins.spillway.decide")
local detect = require("apisix.plugins.spillway.detect")

local re_find, re_gsub = ngx.re.find, ngx.re.gsub
local find, sub, byte, format, gsub = string.find, string.sub, string.byte, string.format, string.gsub
local type, pairs, ipairs, getmetatable, tonumber = type, pairs, ipairs, getmetatable, tonumber
local floor = math.floor

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

-- Every key in a JSON text: a string followed by ':'; a string that is not one is skipped whole.
local KEY = [=["(?:[^"\\]++|\\.)*+"(?!\s*+:)(*SKIP)(*F)|"(?:[^"\\]++|\\.)*+"]=]

-- How many keys the decoded objects hold, at any depth.
local function keys_held(v)
    local n = 0
    if is_list(v) then
        for _, item in ipairs(v) do
            if type(item) == "table" then
                n = n + keys_held(item)
            end
        end
    elseif type(v) == "table" then
        for _, item in pairs(v) do
            n = n + 1
            if type(item) == "table" then
                n = n + keys_held(item)
            end
        end
    end
    return n
end

-- The smallest key (by its bytes, decoded) found twice in one object of text, which cjson has
-- read as doc (keeping the last of them); nil when none is. When the text writes as many keys as
-- doc holds, none is (one pass of PCRE, and a walk of doc); else a pass over the text names it: a
-- string followed by ':' is a key of the innermost open object. Linear in the text either way.
local function duplicate_key(text, doc)
    local _, written = re_gsub(text, KEY, "", "jo")
    if written == keys_held(doc) then
        return nil
    end
    local open, depth, smallest = {}, 0, nil
    local pos = 1
    while true do
        local at = find(text, '[{}"]', pos)
        if not at then
            return smallest
        end
        local c = byte(text, at)
        if c == 123 then  -- {
            depth = depth + 1
            open[depth] = {}
            pos = at + 1
        elseif c == 125 then  -- }
            open[depth] = nil
            depth = depth - 1
            pos = at + 1
        else
            local close, escaped = at + 1, false
            while true do
                close = find(text, '["\\]', close)
                if byte(text, close) == 34 then
                    break
                end
                escaped, close = true, close + 2
            end
            pos = close + 1
            local after = find(text, "[^ \t\r\n]", pos)
            if after and byte(text, after) == 58 then  -- ':'
                local key = sub(text, at, close)
                key = escaped and cjson.decode(key) or sub(key, 2, -2)
                local keys = open[depth]
                if keys[key] then
                    if smallest == nil or key < smallest then
                        smallest = key
                    end
                else
                    keys[key] = true
                end
            end
        end
    end
end

-- The JSON object text holds and the smallest key found twice in one of its objects (nil when
-- none is); nil when it holds no object.
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
    return doc, duplicate_key(text, doc)
end
_M.document = document

-- The refusal's words, naming the key as the runner does (content.duplicate_key_message):
-- printable ASCII as is, but for the quote and the backslash; every other byte as \\xhh.
local function shown(c)
    local b = byte(c)
    return (b >= 32 and b < 127 and b ~= 34 and b ~= 92) and c or format("\\x%02x", b)
end

function _M.duplicate_key_message(key)
    local more = #key > 64 and "..." or ""
    local named = gsub(sub(key, 1, 64), ".", shown)
    return 'duplicate key "' .. named .. more .. '" in the JSON body: Triton reads the first of '
           .. "them, so each key may appear once in an object"
end

-- Largest binary_data_size read as a size: whole numbers up to it are exact as doubles.
local MOST_BINARY = 2 ^ 53

-- How many bytes the binary tensors after the JSON header hold, as Triton sums them (each
-- input's binary_data_size); nil when one is not a size or the sum passes most.
local function binary_bytes(doc, most)
    local total = 0
    if not is_list(doc.inputs) then
        return total
    end
    for _, tensor in ipairs(doc.inputs) do
        local p = is_object(tensor) and tensor.parameters or nil
        if is_object(p) and p.binary_data_size ~= nil then
            local size = p.binary_data_size
            if type(size) ~= "number" or size < 0 or size > MOST_BINARY or size ~= floor(size) then
                return nil
            end
            total = total + size
            if total > most then
                return nil
            end
        end
    end
    return total
end

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

-- Every string in data at any depth: list elements, object keys and values.
local function strings(data, texts)
    if type(data) == "string" then
        texts[#texts + 1] = data
    elseif is_list(data) then
        for _, item in ipairs(data) do
            strings(item, texts)
        end
    elseif type(data) == "table" then
        for k, v in pairs(data) do
            texts[#texts + 1] = k
            strings(v, texts)
        end
    end
end

local function parameters(owner, texts)
    local p = owner.parameters
    if is_object(p) then
        strings(p, texts)
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
-- be read, or (third) why the body is refused (all nil: read, nothing found). read_body() gives
-- the body, called only when its declared size is within max_bytes.
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
    local json_length = headers[_M.HEADER_JSON_LENGTH]
    local header = json_header(body, json_length)
    local doc, duplicate
    if header then
        doc, duplicate = document(header)
    end
    if not doc then
        return nil, WHY.not_json
    end
    if duplicate then
        return nil, nil, _M.duplicate_key_message(duplicate)
    end
    local texts, binary_text = text_inputs(doc)
    if detect.read(budget, #body) then
        return nil, WHY.over_budget
    end
    local found, over = detect.first_found(c.detectors, texts, budget)
    if found or over then
        return found, over and WHY.over_budget
    end
    if json_length ~= nil and #body - #header ~= binary_bytes(doc, #body) then
        return nil, WHY.trailing_bytes
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
-- class that may not leave when what was found keeps it home (a refused body too). Returns what
-- was found (a detector's name), why the text was unreadable, true, and why the body is refused;
-- nothing when it was not read.
function _M.check(f, tbl, policy, live, read_body)
    if not _M.applies(policy, f) then
        return nil
    end
    local probe = decide.decide(f, tbl, policy, live)
    if probe.target == decide.LOCAL or probe.target == decide.SHED then
        return nil
    end
    local c = policy.content.c
    local found, why, refusal = _M.verdict(c, f.headers, read_body)
    if refusal or stays(c, found, why) then
        rawset(f.headers, policy.classification_header, c.classify_as)
    end
    return found, why, true, refusal
end

-- check(), with what it found counted (count(key): "cm:<detector>" or "cu:<reason>"). When it
-- kept the request home: what the residency log names (the detector, never the text) and the
-- class the request was sent with, before the one it is decided as; for a refused body, why
-- (refusal: the answer's words).
function _M.screen(f, tbl, policy, live, read_body, count)
    if policy.content == nil then
        return nil
    end
    local sent = f.headers[policy.classification_header]
    local found, why, read, refusal = _M.check(f, tbl, policy, live, read_body)
    if not read then
        return nil
    end
    if refusal then
        return { refusal = refusal }
    end
    if found or why then
        count(found and (PREFIX.content_match .. found) or (PREFIX.content_unscannable .. why))
    end
    if stays(policy.content.c, found, why) then
        return { label = _M.label(found, why), classification = sent }
    end
    return nil
end

-- The label the residency log shows (never the text); a refusal's, as the runner's Verdict.label.
function _M.label(found, why, refusal)
    if refusal then
        return "refused:" .. refusal
    end
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
