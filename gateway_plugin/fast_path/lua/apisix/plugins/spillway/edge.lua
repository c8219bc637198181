-- One reading of each request, settled before anything reads it, and what of it may leave: the
-- Lua half of gateway_plugin/request/reading.py and functions/contract.py's gateway_path.
--
-- nginx, APISIX's plugins, the runner and the function would each read a request their own way
-- (nginx's $http_x_tenant takes the first of X-Tenant and X_Tenant, the runner joined them, the
-- function decoded the path again). So, first thing on every request:
--   * more than MAX_HEADERS header fields: 431 (the runner is given at most that many);
--   * every spelling of Spillway's own headers (X-Spillway-*) a client sent is removed, and an
--     "_" spelling of a header nginx frames the body by (Content-Length, Transfer-Encoding) is
--     refused (400): nginx reads only the "-" one, and so must everything else;
--   * the path must be nginx's $uri in normal form, decoded once: an escape left in it (the
--     client encoded it twice) or a dot segment or repeated slash nginx left is refused (400);
--   * the headers a decision reads, sent in several spellings or repeated, are written back as
--     one (values of every spelling joined, spellings in sorted order); a tenant named twice
--     differently is refused (400).
-- The decision reaches traffic-split (on the ext-plugin route; the fast path's plugin sets the
-- upstream itself) and the loggers through the request's context (the spillway_upstream,
-- spillway_worker and spillway_decision_tenant variables), which no client can write; a request
-- that goes to a cloud function keeps only the headers its target may receive; and the upstream
-- is sent the path as decided, encoded once.

local core = require("apisix.core")
local C = require("apisix.plugins.spillway.contract")
local counters = require("apisix.plugins.spillway.counters")

local ngx = ngx
local ngx_req = ngx.req
local clear_header, set_header = ngx_req.clear_header, ngx_req.set_header
local find, sub, byte, lower, gsub = string.find, string.sub, string.byte, string.lower, string.gsub
local format, concat, sort = string.format, table.concat, table.sort
local pairs, ipairs, type, tostring, unpack = pairs, ipairs, type, tostring, unpack

local _M = { MAX_HEADERS = 100 }

local OWN_PREFIX = C.HEADER.own_prefix
-- nginx frames a body by these, in their "-" spelling only (header_names.FRAMING).
local FRAMING = {}
for _, name in ipairs(C.FRAMING) do
    FRAMING[name] = true
end
local LOCAL, SHED, AUDIT = C.TARGET["local"], C.TARGET.shed, C.AUDIT

core.ctx.register_var(C.VAR.upstream, function(ctx) return ctx.spillway_upstream end)
core.ctx.register_var(C.VAR.worker, function(ctx) return ctx.spillway_worker end)
core.ctx.register_var(C.VAR.decision_tenant, function(ctx) return ctx.spillway_decision_tenant end)

-- The audit trail (gateway_plugin/request/audit.py): the decision as a logger's log_format reads
-- it, built only when a logger asks. The fast path's plugin leaves its decision in ctx.spillway;
-- on the ext-plugin route the runner's X-Spillway-Audit (taken in the header filter, below) holds
-- the fields percent-encoded, joined by ";"; a request refused at the edge has ctx.spillway_refused.
local AUDIT_FIELDS = AUDIT.fields
_M.AUDIT_HEADER = C.HEADER.audit

local function fast_path_audit(seen)
    local target = seen.target
    return {
        via = AUDIT.fast_path,
        decision = (target == LOCAL or target == SHED) and target or AUDIT.cloud,
        target = target, reason = seen.label, tenant = seen.tenant,
        class = counters.tenant_key(seen.class), model = counters.tenant_key(seen.request_model),
        cost = format("%.10g", seen.cost or 0),
    }
end

local AUDIT_FIELD = "([^" .. AUDIT.sep .. "]*)" .. AUDIT.sep
local function runner_audit(raw)
    local audit, i = { via = AUDIT.ext_plugin }, 0
    for field in (raw .. AUDIT.sep):gmatch(AUDIT_FIELD) do
        i = i + 1
        local name = AUDIT_FIELDS[i]
        if name == nil then
            break
        end
        audit[name] = field ~= "" and ngx.unescape_uri(field) or nil
    end
    return audit
end

local function audit_of(ctx)
    local audit = ctx.spillway_audit
    if audit == nil then
        if ctx.spillway then
            audit = fast_path_audit(ctx.spillway)
        elseif ctx.spillway_audit_raw then
            audit = runner_audit(ctx.spillway_audit_raw)
        elseif ctx.spillway_refused then
            audit = { decision = "refused", reason = tostring(ctx.spillway_refused), cost = "0",
                      via = ctx.spillway_via }
        else
            return nil
        end
        ctx.spillway_audit = audit
    end
    return audit
end

for _, name in ipairs({ "via", unpack(AUDIT_FIELDS) }) do
    core.ctx.register_var(AUDIT.var_prefix .. name, function(ctx)
        local audit = audit_of(ctx)
        return audit and audit[name]
    end)
end

-- The runner's audit header, out of the answer and into the request's context: in the access
-- phase, before an upstream answers (one that sent its own could otherwise write the line), or in
-- the header filter when the runner answered itself (a Stop: no access phase, no upstream). Any
-- copy an upstream sent is removed from the answer either way.
function _M.take_audit(ctx, before_upstream)
    local raw = ngx.header[_M.AUDIT_HEADER]
    if before_upstream or not ctx.spillway_audit_taken then
        ctx.spillway_audit_taken = true
        if raw then
            ctx.spillway_audit_raw = type(raw) == "table" and raw[1] or raw
        end
    end
    if raw then
        ngx.header[_M.AUDIT_HEADER] = nil
    end
end

function _M.fold(name)
    return (gsub(lower(name), "_", "-"))
end

-- Names come lower-cased from ngx.req.get_headers; "x-spillway-" or any "_" spelling of it (gsub,
-- which LuaJIT does not compile, only for a name that has a "_").
local function own(name)
    if byte(name, 1) ~= 120 or #name <= #OWN_PREFIX then
        return false
    end
    local head = sub(name, 1, #OWN_PREFIX)
    return head == OWN_PREFIX or (find(head, "_", 1, true) ~= nil and (gsub(head, "_", "-")) == OWN_PREFIX)
end

local function escaped(c)
    return format("%%%02X", byte(c))
end

local function quote(s, keep_slash)
    local pattern = keep_slash and "[^A-Za-z0-9_.~/-]" or "[^A-Za-z0-9_.~-]"
    return (gsub(s, pattern, escaped))
end
_M.quote = quote

-- Repeated slashes merged and dot segments removed (RFC 3986, 5.2.4); no trailing slash; nothing
-- decoded (functions/contract.py's resolved_path).
function _M.resolved_path(path)
    if byte(path, 1) == 47 and not (find(path, "//", 1, true) or find(path, "/.", 1, true)
                                    or (path ~= "/" and byte(path, -1) == 47)) then
        return path
    end
    local segments = {}
    for segment in (path .. "/"):gmatch("([^/]*)/") do
        if segment == ".." then
            if #segments > 0 then
                segments[#segments] = nil
            end
        elseif segment ~= "" and segment ~= "." then
            segments[#segments + 1] = segment
        end
    end
    return "/" .. concat(segments, "/")
end

-- The path to decide on from nginx's $uri (functions/contract.py's gateway_path); nil and why
-- when it holds an escape or is not in normal form.
function _M.gateway_path(path)
    if find(path, "%", 1, true) and find(path, "%%%x%x") then
        return nil, "request path is percent-encoded more than once; encode each byte once (a '%' "
                    .. "itself is %25, and must not be followed by two hex digits once decoded)"
    end
    local resolved = _M.resolved_path(path)
    if resolved ~= path and resolved .. "/" ~= path then
        return nil, "request path is not in normal form (repeated slashes or dot segments); send "
                    .. resolved
    end
    return resolved
end

-- Every request, before anything reads it. Returns the headers (Spillway's own removed), the path
-- and the names sent in an "_" spelling or repeated; or nil, a status and why.
function _M.admit(ctx)
    local raw, err = ngx_req.get_headers(_M.MAX_HEADERS)
    if err == "truncated" then
        return nil, 431, "more than " .. _M.MAX_HEADERS .. " header fields; send at most "
                         .. _M.MAX_HEADERS
    end
    local odd
    for name, value in pairs(raw) do
        if own(name) then
            clear_header(name)
            raw[name] = nil
        elseif type(value) == "table" or find(name, "_", 1, true) then
            if FRAMING[_M.fold(name)] and find(name, "_", 1, true) then
                return nil, 400, "header " .. name .. ": nginx frames the body by the '-' spelling "
                                 .. "alone; send " .. _M.fold(name)
            end
            odd = odd or {}
            odd[#odd + 1] = name
        end
    end
    local path, why = _M.gateway_path(ctx.var.uri)
    if not path then
        return nil, 400, why
    end
    return raw, path, odd
end

-- The body, read whole before anything is counted for the request (a cloud slot, a tenant's
-- concurrency slot, the cluster's in-flight count, the runner's decision): a client that sends
-- it a byte at a time holds none of them meanwhile, and one that leaves before the end leaves
-- nothing to release. nginx bounds the read (client_body_timeout between two reads,
-- client_max_body_size) and ends the request itself past either; it reads the body whole before
-- proxying it anyway (proxy_request_buffering), so what goes upstream is unchanged.
function _M.read_body()
    ngx_req.read_body()
end

local function spellings_of(raw, key)
    local names = {}
    for name in pairs(raw) do
        if name == key or (find(name, "_", 1, true) and _M.fold(name) == key) then
            names[#names + 1] = name
        end
    end
    sort(names)
    return names
end

local function values_of(raw, names)
    local values = {}
    for _, name in ipairs(names) do
        local v = raw[name]
        if type(v) == "table" then
            for _, one in ipairs(v) do
                values[#values + 1] = one
            end
        else
            values[#values + 1] = v
        end
    end
    return values
end

local function distinct(values)
    local seen, n = {}, 0
    for _, v in ipairs(values) do
        if not seen[v] then
            seen[v], n = true, n + 1
        end
    end
    return n
end

-- One spelling of every header in read (a set) that came in several or repeated, written back so
-- every later layer reads what the decision reads; nil, or a status and why.
function _M.settle(ctx, raw, odd, read, tenant_header)
    if not odd then
        return nil
    end
    local keys
    for _, name in ipairs(odd) do
        local key = _M.fold(name)
        if read[key] then
            keys = keys or {}
            keys[key] = true
        end
    end
    for key in pairs(keys or {}) do
        local names = spellings_of(raw, key)
        local values = values_of(raw, names)
        local value = concat(values, ", ")
        if key == tenant_header then
            local n = distinct(values)
            if n > 1 then
                return 400, key .. " sent with " .. n .. " different values; send it once"
            end
            value = values[1]
        end
        for _, name in ipairs(names) do
            if name ~= key then
                clear_header(name)
                raw[name] = nil
            end
        end
        set_header(key, value)
        raw[key] = value
        ctx.var["http_" .. gsub(key, "-", "_")] = nil
    end
    return nil
end

-- Header key gone in every spelling the client sent.
function _M.forget(raw, key)
    for name in pairs(raw) do
        if name == key or (find(name, "_", 1, true) and _M.fold(name) == key) then
            clear_header(name)
            raw[name] = nil
        end
    end
end

-- Who the request is from (request/reading.py's as_decided): with tenant_from_consumer the
-- tenant is the APISIX consumer that authenticated it and the client's header is removed; a
-- consumer whose data may not leave keeps the request home whatever its label. False when the
-- tenant must come from a consumer and no authentication named one.
function _M.identify(ctx, raw, headers, policy)
    local consumer = ctx.consumer_name
    if policy.tenant_from_consumer then
        if not consumer then
            return false
        end
        _M.forget(raw, policy.tenant_header)
        rawset(headers, policy.tenant_header, consumer)
    end
    local ceiling = consumer and policy.consumer_ceilings[consumer]
    if ceiling and not policy.cloud_allowed_set[ceiling] then
        rawset(headers, policy.classification_header, ceiling)
    end
    return true
end

-- Only what the target may receive (a set) leaves for a cloud function.
function _M.forward_only(raw, allowed)
    for name in pairs(raw) do
        if not allowed[name] then
            clear_header(name)
        end
    end
end

-- The upstream is sent the path as decided, encoded once, whenever the client's differs from it
-- (escapes, dot segments, repeated slashes): it cannot read another one.
function _M.pin_path(ctx)
    local uri, request_uri = ctx.var.uri, ngx.var.request_uri
    local q = find(request_uri, "?", 1, true)
    local sent = q and sub(request_uri, 1, q - 1) or request_uri
    if sent ~= uri then
        local args = ctx.var.args
        ctx.var.upstream_uri = quote(uri, true) .. ((args and args ~= "") and ("?" .. args) or "")
    end
end

return _M
