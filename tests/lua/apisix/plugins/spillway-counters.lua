-- Test-only plugin: runs the spillway plugin's shared-dict counters (spillway/counters.lua) and
-- the decision table's store (spillway/table.lua) on small dicts of their own filled to the last
-- byte, keys the tenant names of the known-answer vectors, and answers what each step saw.

local core = require("apisix.core")
local counters = require("apisix.plugins.spillway.counters")
local table_mod = require("apisix.plugins.spillway.table")
local json = require("cjson.safe")

-- The same vectors as tests/integration/test_apisix_fast_path_counters.py TENANT_VECTORS.
local TENANT_VECTORS = {
    "t1", "acme corp", string.rep("t", 256), string.rep("t", 257), string.rep("t", 5000),
    "caf\195\169", "a\255b", "tab\there", "",
}

-- Junk of 64 bytes, then of the smallest size, until the dict takes no more; how many.
local function fill(d_)
    local junk = 0
    while d_:safe_set("junk:" .. junk, string.rep("x", 64)) do
        junk = junk + 1
    end
    local small = 0
    while d_:safe_set("s:" .. small, 0) do
        small = small + 1
    end
    return junk, small
end

local function version_stored(d_)
    local text = table_mod.stored(d_)
    return text and json.decode(text).version or json.null
end

local function doc(version, bytes)
    return json.encode({ version = version, pad = string.rep("p", bytes) })
end

-- How a table is stored in a full dict: today's one key, then table.lua's classes.
local function store_steps()
    local d_ = ngx.shared["spillway-store"]
    d_:flush_all()
    d_:flush_expired()
    local seen = {}
    d_:safe_set("plain", string.rep("a", 1000))
    fill(d_)
    seen.plain_grow = { d_:safe_set("plain", string.rep("b", 100000)) }
    seen.plain_left = d_:get("plain") ~= nil
    d_:flush_all()
    d_:flush_expired()
    table_mod.prepare(d_)
    seen.first = { table_mod.store(d_, doc(1, 1000)) }
    local junk, small = fill(d_)
    seen.in_place = { table_mod.store(d_, doc(2, 30000)) }
    seen.after_in_place = version_stored(d_)
    seen.grow = { table_mod.store(d_, doc(3, 100000)) }
    seen.after_grow = version_stored(d_)
    local kept = 0
    for i = 0, junk - 1 do
        kept = kept + (d_:get("junk:" .. i) and 1 or 0)
    end
    for i = 0, small - 1 do
        kept = kept + (d_:get("s:" .. i) and 1 or 0)
    end
    seen.nothing_evicted = kept == junk + small
    for i = 0, junk - 1 do
        d_:delete("junk:" .. i)
    end
    seen.grown = { table_mod.store(d_, doc(4, 100000)) }
    seen.after_grown = version_stored(d_)
    seen.class = d_:get("table_class")
    seen.old_class_freed = d_:get("table:65536") == nil
    return seen
end

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
    -- Thirteen cents summed (0.12999999999999998), and the mark the runner sends back: the counter
    -- as the plugin's report carried it, through cjson (0.13).
    local cents = 0
    for _ = 1, 13 do
        cents = cents + 0.01
    end
    seen.since_rounded_mark = counters.since_mark(cents, json.decode(json.encode(cents)))
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
    seen.tenant_keys = {}
    for i, name in ipairs(TENANT_VECTORS) do
        seen.tenant_keys[i] = counters.tenant_key(name)
    end
    seen.store = store_steps()
    core.response.set_header("Content-Type", "application/json")
    ngx.say(json.encode(seen))
    return ngx.exit(200)
end

return _M
