-- X-Spillway-Signature in Lua: functions/signature.py's sign() and canonical_target().
--
-- v1 = hex HMAC-SHA256(key, t \n nonce \n METHOD \n canonical target \n body digest), where the
-- canonical target is nginx's $uri (decoded once; resolved when it is not plain) and the decoded
-- arguments sorted, every byte outside the unreserved set percent-encoded.

local core = require("apisix.core")
local edge = require("apisix.plugins.spillway.edge")
local resty_sha256 = require("resty.sha256")  -- also declares SHA256_CTX and its functions
local resty_random = require("resty.random")
local to_hex = require("resty.string").to_hex  -- also declares ngx_hex_dump
local ffi = require("ffi")
local bit = require("bit")
local quote = edge.quote
local C = ffi.C
local ffi_copy, ffi_string = ffi.copy, ffi.string
local str_gsub, str_byte, str_char = string.gsub, string.byte, string.char
local concat, sort = table.concat, table.sort
local type, ipairs, pairs, next, tostring = type, ipairs, pairs, next, tostring

local _M = { UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD" }
local SIGNATURE_HEADER = require("apisix.plugins.spillway.contract").HEADER.signature

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

-- A path's canonical text, kept per path (most requests carry few distinct paths); clients choose
-- paths, so only those up to MAX_PATH_BYTES are kept, and the cache is emptied at MAX_PATHS.
local MAX_PATHS, MAX_PATH_BYTES = 256, 512
local paths, n_paths = {}, 0

local function path_text(path)
    local text = paths[path]
    if text == nil then
        text = plain(path) and path or quote(edge.resolved_path(path), true)
        if #path > MAX_PATH_BYTES then
            return text
        end
        if n_paths >= MAX_PATHS then
            paths, n_paths = {}, 0
        end
        paths[path], n_paths = text, n_paths + 1
    end
    return text
end

-- path: nginx's decoded $uri; args: ngx.req.get_uri_args()'s table (value true: no '=').
function _M.canonical_target(path, args)
    local text = path_text(path)
    if next(args) == nil then
        return text
    end
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

-- HMAC-SHA256 (RFC 2104) from the two SHA-256 states after the key's inner and outer pad blocks,
-- computed once per key: a request copies them and hashes only its message, where an HMAC context
-- re-derived the padded key on every reset.
local BLOCK, DIGEST = 64, 32
local ctx_t = ffi.typeof("SHA256_CTX[1]")
local CTX_BYTES = ffi.sizeof("SHA256_CTX")
local work = ffi.new(ctx_t)
local inner_digest = ffi.new("unsigned char[?]", DIGEST)
local mac_hex = ffi.new("unsigned char[?]", DIGEST * 2)

local function pad_state(key, byte_value)
    local block = {}
    for i = 1, BLOCK do
        block[i] = str_char(bit.bxor(str_byte(key, i) or 0, byte_value))
    end
    local state = ffi.new(ctx_t)
    C.SHA256_Init(state)
    C.SHA256_Update(state, concat(block), BLOCK)
    return state
end

local states = {}  -- per key: { inner, outer }; one key per target, from the environment

local function states_of(key)
    local s = states[key]
    if s == nil then
        local k = key
        if #k > BLOCK then
            local h = resty_sha256:new()
            h:update(k)
            k = h:final()
        end
        s = { pad_state(k, 0x36), pad_state(k, 0x5c) }
        states[key] = s
    end
    return s
end

local function update(s)
    C.SHA256_Update(work, s, #s)
end

-- hex HMAC-SHA256(key, t \n nonce \n METHOD \n target \n digest), the message hashed in pieces.
function _M.mac(key, t, nonce, method, target, digest)
    local s = states_of(key)
    ffi_copy(work, s[1], CTX_BYTES)
    update(t)
    update("\n")
    update(nonce)
    update("\n")
    update(method:upper())
    update("\n")
    update(target)
    update("\n")
    update(digest)
    C.SHA256_Final(inner_digest, work)
    ffi_copy(work, s[2], CTX_BYTES)
    C.SHA256_Update(work, inner_digest, DIGEST)
    C.SHA256_Final(inner_digest, work)
    C.ngx_hex_dump(mac_hex, inner_digest, DIGEST)
    return ffi_string(mac_hex, DIGEST * 2)
end

-- Nonces: 96 random bits drawn once per worker process, then a counter. Unique across workers,
-- restarts and nodes (the function's replay cache needs no more); the MAC over it, not the
-- nonce's secrecy, is what stops a forger. Drawn anew in a process that was forked after drawing.
local nonce_prefix, nonce_pid, nonce_count = nil, nil, 0
local MAX_COUNT = 1e12  -- a new prefix long before a count would print as 1e+14

local function next_nonce()
    local pid = ngx.worker.pid()
    if nonce_pid ~= pid or nonce_count >= MAX_COUNT then
        local bytes = resty_random.bytes(12, true) or resty_random.bytes(12)
        nonce_prefix, nonce_pid, nonce_count = to_hex(bytes) .. "-", pid, 0
    end
    nonce_count = nonce_count + 1
    return nonce_prefix .. nonce_count
end

-- The unix second as text, made once per second.
local last_second, last_text = nil, nil

-- The header value; body nil signs UNSIGNED-PAYLOAD.
function _M.header(key, method, target, body, now, nonce)
    local second = math.floor(now)
    if second ~= last_second then
        last_second, last_text = second, tostring(second)
    end
    local t = last_text
    local n = nonce or next_nonce()
    local digest = body and _M.body_digest(body) or _M.UNSIGNED_PAYLOAD
    return "t=" .. t .. ",n=" .. n .. ",v1=" .. _M.mac(key, t, n, method, target, digest)
end

local signing_keys = {}
local function signing_key(env)
    local key = signing_keys[env]
    if key == nil then
        key = os.getenv(env) or ""
        signing_keys[env] = key
    end
    return key
end

-- X-Spillway-Signature on a request going to spec's target, when it has a key. nginx's call sets
-- the header, with APISIX's two header caches kept in step (its wrapper costs a microsecond).
function _M.request(ctx, spec)
    local key = spec.key_env and signing_key(spec.key_env) or ""
    if key == "" then
        return
    end
    local target = _M.canonical_target(ctx.var.uri, core.request.get_uri_args(ctx))
    local body = nil
    if spec.sign_body then
        body = core.request.get_body() or ""
    end
    local value = _M.header(key, ngx.req.get_method(), target, body, ngx.time())
    ngx.req.set_header(SIGNATURE_HEADER, value)
    ctx.var.http_x_spillway_signature = nil
    if ctx.headers then
        ctx.headers[SIGNATURE_HEADER] = value
    end
end

return _M
