-- The function URL a cloud decision goes to, set by the plugin itself.
--
-- traffic-split would pick it from the spillway_upstream variable, but on every request it compiles
-- its match expression again, rebuilds the upstream from the rule, validates that against
-- APISIX's upstream schema and JSON-encodes it for a log line the level drops; and LuaJIT cannot
-- compile that code, so the plugin's own traces that run into it are dropped too. The route names
-- its targets' upstreams in the plugin's conf (`upstreams`, what traffic-split's rules carry):
-- they are checked once, with the conf, and built once per conf; per request only a name's DNS
-- answer is looked up (APISIX's resolver caches it), and the upstream is set as traffic-split
-- sets it (apisix.upstream.set, its scheme for https).

local core = require("apisix.core")
local apisix_upstream = require("apisix.upstream")
local ipmatcher = require("resty.ipmatcher")

local pairs, ipairs, setmetatable, tostring = pairs, ipairs, setmetatable, tostring

local _M = {}

local schema = {
    type = "object",
    description = "APISIX upstream objects by target name: where a cloud decision for the target "
                  .. "goes (python -m gateway_plugin apisix-route --fast-path writes them)",
    patternProperties = { ["^[a-z][a-z0-9_-]{0,31}$"] = { type = "object" } },
    additionalProperties = false,
}
_M.schema = schema

-- Each upstream as APISIX's Admin API would take it; nil, or what is wrong with which.
function _M.check(upstreams)
    for name, up in pairs(upstreams or {}) do
        local ok, err = apisix_upstream.check_schema(up)
        if not ok then
            return "upstreams." .. name .. ": " .. err
        end
    end
    return nil
end

local function is_ip(host)
    return ipmatcher.parse_ipv4(host) or ipmatcher.parse_ipv6(host)
end

-- One target's upstream as apisix.upstream.set takes it (nodes as a list, as traffic-split makes).
local function build(name, up, route, conf_version, generation)
    local nodes, domains = {}, false
    for addr, weight in pairs(up.nodes) do
        local host, port = core.utils.parse_addr(addr)
        local node = { host = host, port = port, weight = weight }
        if not is_ip(host) then
            node.domain, domains = host, true
        end
        nodes[#nodes + 1] = node
    end
    local conf = {
        name = up.name, type = up.type, hash_on = up.hash_on, key = up.key, scheme = up.scheme,
        pass_host = up.pass_host, upstream_host = up.upstream_host, timeout = up.timeout,
        nodes = nodes, parent = route,
    }
    return {
        conf = conf, domains = domains, https = up.scheme == "https",
        key = up.type .. "#route_" .. tostring(route.value.id) .. "_spillway_" .. name,
        version = tostring(conf_version) .. "#spillway" .. generation,
        name = name, source = up, route = route, conf_version = conf_version, generation = generation,
    }
end

-- A resolver that fails fails for every request: said once per LOG_EVERY_S per name.
local LOG_EVERY_S = 10
local logged = {}

local function resolver_failed(domain, err)
    local now = ngx.now()
    if (logged[domain] or 0) + LOG_EVERY_S <= now then
        logged[domain] = now
        core.log.error("spillway: resolving ", domain, ": ", err, " (requests go to its last address)")
    end
end

-- A name's address as APISIX's resolver has it now; a new entry (a new version for APISIX's
-- caches) only when an address changed. Unresolvable: the last address, as traffic-split keeps it.
local function resolved(entry)
    local changed
    for _, node in ipairs(entry.conf.nodes) do
        if node.domain then
            local ip, err = core.resolver.parse_domain(node.domain)
            if err then
                resolver_failed(node.domain, err)
            end
            if ip and ip ~= node.host then
                changed = changed or {}
                changed[node.domain] = ip
            end
        end
    end
    if changed == nil then
        return entry
    end
    local fresh = build(entry.name, entry.source, entry.route, entry.conf_version, entry.generation + 1)
    for i, node in ipairs(fresh.conf.nodes) do
        node.host = changed[node.domain] or entry.conf.nodes[i].host
    end
    return fresh
end

local built = setmetatable({}, { __mode = "k" })

-- Sends the request to the named target's upstream; false when the route has none for it.
function _M.set(ctx, conf, name)
    local by_name = built[conf]
    if by_name == nil then
        by_name = {}
        built[conf] = by_name
    end
    local entry = by_name[name]
    if entry == nil then
        local up = conf.upstreams[name]
        if up == nil then
            return false
        end
        entry = build(name, up, ctx.matched_route, ctx.conf_version, 0)
        by_name[name] = entry
    end
    if entry.domains then
        entry = resolved(entry)
        by_name[name] = entry
    end
    apisix_upstream.set(ctx, entry.key, entry.version, entry.conf)
    if entry.https then
        apisix_upstream.set_scheme(ctx, entry.conf)
    end
    return true
end

return _M
