-- spillway-edge: the ext-plugin route's edge, around the runner's decision.
--
-- rewrite (priority above ext-plugin-pre-req's 12000, so before the runner is asked): the one
-- reading of the request (spillway/edge.lua): at most 100 header fields, no client spelling of
-- X-Spillway-*, a path already in normal form. The runner then settles the headers it reads and
-- sets X-Spillway-Target (and X-Spillway-Worker) in its rewrite.
-- access (before traffic-split, aws-lambda and the loggers): the runner's decision moves from its
-- header into the request's context (spillway_upstream, spillway_worker), which traffic-split
-- matches and the logger reports, and which no client can write; the header itself never leaves.

local core = require("apisix.core")
local edge = require("apisix.plugins.spillway.edge")

local ngx = ngx
local clear_header = ngx.req.clear_header

local _M = {
    version = 0.1,
    priority = 12010,
    name = "spillway-edge",
    schema = { type = "object", additionalProperties = false },
}

function _M.check_schema(conf)
    return core.schema.check(_M.schema, conf)
end

function _M.rewrite(conf, ctx)
    local raw, status, why = edge.admit(ctx)
    if not raw then
        return status, { error = why }
    end
end

function _M.access(conf, ctx)
    local value = ngx.var.http_x_spillway_target
    if value then
        ctx.spillway_upstream = value
        clear_header("X-Spillway-Target")
    end
    local worker = ngx.var.http_x_spillway_worker
    if worker then
        ctx.spillway_worker = worker
        clear_header("X-Spillway-Worker")
    end
    edge.pin_path(ctx)
end

return _M
