-- spillway-edge: the ext-plugin route's edge, around the runner's decision.
--
-- rewrite (priority above ext-plugin-pre-req's 12000, so before the runner is asked): the one
-- reading of the request (spillway/edge.lua): at most 100 header fields, no client spelling of
-- X-Spillway-*, a path already in normal form; then the body, read whole. The runner then settles
-- the headers it reads and sets X-Spillway-Target (and X-Spillway-Worker) in its rewrite.
-- access (before traffic-split, aws-lambda and the loggers): the runner's decision moves from its
-- header into the request's context (spillway_upstream, spillway_worker, spillway_decision_tenant),
-- which traffic-split matches and the logger reports, and which no client can write; the header itself never leaves.
-- header_filter and body_filter count the events of a streamed answer for the outcome's logger.
-- A runner that has stopped answering (spillway/link.lua watches it) is treated as a dead one:
-- requests get 503 at once instead of waiting out ext-plugin's 60 s socket timeout.

local core = require("apisix.core")
local edge = require("apisix.plugins.spillway.edge")
local link = require("apisix.plugins.spillway.link")
local stream = require("apisix.plugins.spillway.stream")

local ngx = ngx
local clear_header = ngx.req.clear_header
local floor = math.floor
local C = require("apisix.plugins.spillway.contract")
local DICT, HEADER, VIA = C.DICT, C.HEADER, C.AUDIT.ext_plugin

-- nginx's variable for a request header.
local function header_var(name)
    return "http_" .. name:gsub("-", "_")
end
local TARGET_VAR, WORKER_VAR, TENANT_VAR = header_var(HEADER.target), header_var(HEADER.worker),
    header_var(HEADER.tenant)

local _M = {
    version = 0.1,
    priority = 12010,
    name = C.EDGE_PLUGIN,
    schema = { type = "object", additionalProperties = false },
}

function _M.check_schema(conf)
    return core.schema.check(_M.schema, conf)
end

local settings = nil

function _M.init()
    local attr, auth = link.settings()
    if not attr then
        return
    end
    if ngx.shared[DICT] == nil then
        core.log.error("spillway-edge: no lua_shared_dict named ", DICT, "; add nginx_config.http.",
                       "custom_lua_shared_dict: {spillway: 10m} to config.yaml: without it a runner ",
                       "that stops answering makes requests wait out ext-plugin's 60 s timeout")
        return
    end
    settings = attr
    link.watch(attr, auth, ngx.shared[DICT])
end

function _M.rewrite(conf, ctx)
    local silent = settings and link.silent_for(ngx.shared[DICT])
    if silent and silent > settings.dead_after_s then
        ctx.spillway_refused, ctx.spillway_via = 503, VIA
        core.response.set_header("Retry-After", "1")
        return 503, { error = "the Spillway runner has not answered for " .. floor(silent)
                              .. " s; retry shortly" }
    end
    local raw, status, why = edge.admit(ctx)
    if not raw then
        ctx.spillway_refused, ctx.spillway_via = status, VIA
        return status, { error = why }
    end
    edge.read_body()  -- before the runner decides and counts it: a slow client holds nothing meanwhile
    -- Authenticated before the runner (the route raises its authentication plugin's priority):
    -- the runner reads the consumer from here, never from a header the client could have sent.
    if ctx.consumer_name then
        ngx.req.set_header(HEADER.consumer, ctx.consumer_name)
    end
end

function _M.access(conf, ctx)
    local var = ngx.var
    local value = var[TARGET_VAR]
    if value then
        ctx.spillway_upstream = value
        clear_header(HEADER.target)
    end
    local worker = var[WORKER_VAR]
    if worker then
        ctx.spillway_worker = worker
        clear_header(HEADER.worker)
    end
    -- The tenant the decision counted, for the outcome that gives its slot back.
    local tenant = var[TENANT_VAR]
    if tenant then
        ctx.spillway_decision_tenant = tenant
        clear_header(HEADER.tenant)
    end
    if ctx.consumer_name then
        clear_header(HEADER.consumer)
    end
    edge.take_audit(ctx, true)
    edge.pin_path(ctx)
end

-- The runner's audit fields (X-Spillway-Audit, on every answer when the config has an audit
-- logger) go into the request's context for the logger, never to the client. Only a stream's
-- path (the runner's books settle no other as a stream) has its answer's type read.
function _M.header_filter(conf, ctx)
    edge.take_audit(ctx, false)
    if stream.streamed(ctx.var.uri) then
        stream.start(ctx)
    end
end

-- A streamed answer's events, counted for its outcome (spillway/stream.lua).
function _M.body_filter(conf, ctx)
    stream.count(ctx)
end

return _M
