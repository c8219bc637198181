-- Test-only plugin: fills the spillway plugin's shared dict to the last byte with keys of its
-- own (as counters clients multiply would), and answers how many it took.

local core = require("apisix.core")
local json = require("cjson.safe")

local _M = { version = 0.1, priority = 500, name = "spillway-fill", schema = { type = "object" } }

function _M.check_schema(conf)
    return core.schema.check(_M.schema, conf)
end

function _M.access(conf, ctx)
    local d_ = ngx.shared["spillway"]
    local junk, small = 0, 0
    while d_:safe_set("junk:" .. junk, string.rep("x", 64)) do
        junk = junk + 1
    end
    while d_:safe_set("s:" .. small, 0) do
        small = small + 1
    end
    core.response.set_header("Content-Type", "application/json")
    ngx.say(json.encode({ junk = junk, small = small }))
    return ngx.exit(200)
end

return _M
