-- Bench-only plugin (bench/apisix_gateway.py, case noop): the fast path's three phases (access,
-- header_filter, log) at its priority, doing nothing. What any per-request Lua plugin costs is
-- measured by it; what the spillway plugin costs beyond that is Spillway's own work. With
-- read_body (case noop-body) it reads the request's body in its access phase and nothing else, as
-- the fast path does before it decides.

local core = require("apisix.core")

local _M = {
    version = 0.1,
    priority = 12005,
    name = "spillway-noop",
    schema = { type = "object", properties = { read_body = { type = "boolean" } } },
}

function _M.check_schema(conf)
    return core.schema.check(_M.schema, conf)
end

function _M.access(conf, ctx)
    if conf.read_body then
        ngx.req.read_body()
    end
end

function _M.header_filter(conf, ctx)
end

function _M.log(conf, ctx)
end

return _M
