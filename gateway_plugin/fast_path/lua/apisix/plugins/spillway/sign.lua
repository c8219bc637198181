-- X-Spillway-Signature in Lua: functions/signature.py's sign() and canonical_target().
--
-- v1 = hex HMAC-SHA256(key, t \n nonce \n METHOD \n canonical target \n body digest), where the
-- canonical target is nginx's $uri (decoded once; resolved when it is not plain) and the decoded
-- arguments sorted, every byte outside the unreserved set percent-encoded.

local edge = require("apisix.plugins.spillway.edge")
local hmac = require("resty.hmac")
local resty_sha256 = require("resty.sha256")
local resty_random = require("resty.random")
local to_hex = require("resty.string").to_hex
local quote = edge.quote
local str_gsub = string.gsub
local concat, sort = table.concat, table.sort
local type, ipairs, pairs = type, ipairs, pairs

local _M = { UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD" }

local function plain(path)
    if path == "/" then
        return true
    end
    -- (?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)+
    return ngx.re.find(path, [[\A(?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)+\z]], "jo") ~= nil
end

local function less(a, b)
    if a[1] ~= b[1] then
        return a[1] < b[1]
    end
    return a[2] < b[2]
end

-- path: nginx's decoded $uri; args: ngx.req.get_uri_args()'s table (value true: no '=').
function _M.canonical_target(path, args)
    local text = plain(path) and path or quote(edge.resolved_path(path), true)
    local pairs_list = {}
    for k, v in pairs(args) do
        local values = type(v) == "table" and v or { v }
        for _, one in ipairs(values) do
            local value = one == true and "" or one
            pairs_list[#pairs_list + 1] = { (str_gsub(k, "%+", " ")), (str_gsub(value, "%+", " ")) }
        end
    end
    if #pairs_list == 0 then
        return text
    end
    sort(pairs_list, less)
    local parts = {}
    for i, kv in ipairs(pairs_list) do
        parts[i] = quote(kv[1], false) .. "=" .. quote(kv[2], false)
    end
    return text .. "?" .. concat(parts, "&")
end

function _M.body_digest(body)
    local h = resty_sha256:new()
    h:update(body)
    return to_hex(h:final())
end

-- One HMAC context per key, reset after each use (a worker signs one request at a time).
local contexts = {}

function _M.mac(key, t, nonce, method, target, digest)
    local h = contexts[key]
    if h == nil then
        h = hmac:new(key, hmac.ALGOS.SHA256)
        contexts[key] = h
    end
    local mac = h:final(t .. "\n" .. nonce .. "\n" .. method:upper() .. "\n" .. target .. "\n" .. digest, true)
    h:reset()
    return mac
end

-- The header value; body nil signs UNSIGNED-PAYLOAD.
function _M.header(key, method, target, body, now, nonce)
    local t = tostring(math.floor(now))
    local n = nonce or to_hex(resty_random.bytes(12))
    local digest = body and _M.body_digest(body) or _M.UNSIGNED_PAYLOAD
    return "t=" .. t .. ",n=" .. n .. ",v1=" .. _M.mac(key, t, n, method, target, digest)
end

return _M
