-- Test-only plugin: runs the spillway plugin's shared-dict counters (spillway/counters.lua) on a
-- small dict of their own filled to the last byte, and answers what each step saw.

local core = require("apisix.core")
local counters = require("apisix.plugins.spillway.counters")
local json = require("cjson.safe")

local _M = { version = 0.1, priority = 500, name = "spillway-counters", schema = { type = "object" } }

function _M.check_schema(conf)
    return core.schema.check(_M.schema, conf)
end

function _M.access(conf, ctx)
    local d_ = ngx.shared["spillway-full"]
    d_:flush_all()
    d_:flush_expired()
    local seen = {}
    d_:safe_set("node", "n-1")
    d_:safe_set("sp:aws", 5)
    local junk = 0
    while d_:safe_set("junk:" .. junk, string.rep("x", 64)) do
        junk = junk + 1
    end
    local small = 0
    while d_:safe_set("s:" .. small, 0) do  -- the last pages of the smallest items too
        small = small + 1
    end
    seen.junk = junk
    local value, err = counters.add(d_, "if:new", 1)
    seen.add_when_full = { value = value, err = err }
    local taken, take_err = counters.take_tenant(d_, "tif:new")
    seen.tenant_when_full = { value = taken, err = take_err }
    seen.node_kept = d_:get("node")
    seen.spend_kept = d_:get("sp:aws")
    seen.spend_grows = counters.add(d_, "sp:aws", 1.5)
    d_:delete("node")
    d_:delete("junk:0")
    seen.node_made_anew = counters.node(d_)
    seen.since_mark = { counters.since_mark(6.5, 5), counters.since_mark(0.25, 5) }
    for i = 0, 9 do
        d_:delete("s:" .. i)
    end
    seen.tenant_taken = { counters.take_tenant(d_, "tif:t1"), counters.take_tenant(d_, "tif:t1") }
    seen.busy_ttl = d_:ttl("tif:t1")
    counters.release_tenant(d_, "tif:t1")
    seen.one_left = { d_:get("tif:t1"), d_:ttl("tif:t1") }
    counters.release_tenant(d_, "tif:t1")
    seen.idle = { d_:get("tif:t1"), d_:ttl("tif:t1") }
    seen.long_tenant = counters.tenant_key(string.rep("t", 5000))
    seen.short_tenant = counters.tenant_key("t1")
    core.response.set_header("Content-Type", "application/json")
    ngx.say(json.encode(seen))
    return ngx.exit(200)
end

return _M
