-- The plugin's link to the runner: one worker fetches the decision table (POSTing this node's
-- counters: spend per target, the overflow flag it last decided, fail-safe decisions, dropped
-- outcomes, tables it could not store and the room it has) and stores it in the shared dict
-- (table.lua says how); every worker posts its summary of outcomes.

local cjson = require("cjson.safe")
local http = require("resty.http")
local table_mod = require("apisix.plugins.spillway.table")
local report = require("apisix.plugins.spillway.report")
local shared_counters = require("apisix.plugins.spillway.counters")

local pairs, pcall, tostring = pairs, pcall, tostring
-- How long a table is asked to fit the room left after a store failed, before a whole one is tried.
local ROOM_HELD_S = 10

local _M = {}

-- worker: the plugin's per-worker state; with: dict(), current(), log_sometimes(kind, ...).
function _M.start(worker, with)
    local dict, current, log_sometimes = with.dict, with.current, with.log_sometimes

    local function post(path, body)
        local httpc = http.new()
        httpc:set_timeout(worker.attr.timeout_s * 1000)
        return httpc:request_uri("http://" .. worker.attr.runner .. path, {
            method = "POST", body = body, keepalive_timeout = 60000, keepalive_pool = 4,
            headers = { ["Authorization"] = worker.auth, ["Content-Type"] = "application/json" },
        })
    end

    local function counters(prefix, names)
        local out = {}
        for name in pairs(names) do
            local v = dict():get(prefix .. name)
            if v ~= nil then
                out[name] = v
            end
        end
        return out
    end

    local function node_counters()
        local tbl = worker.tbl
        local targets, models = tbl and tbl.targets or {}, tbl and tbl["local"] or {}
        local d_ = dict()
        return cjson.encode({
            node = shared_counters.node(d_),
            spent = counters("sp:", targets),
            hot = counters("hot:", models),
            fail_safe = d_:get("failsafe") or 0,
            dropped = d_:get("dropped") or 0,
            store_failed = d_:get("store_failed") or 0,
            room = worker.room,
        })
    end

    -- A timer's body, never left half-done: an error is logged and the next tick starts afresh.
    local function guarded(flag, body)
        return function(premature)
            if premature or worker[flag] then
                return
            end
            worker[flag] = true
            local ok, err = pcall(body)
            worker[flag] = false
            if not ok then
                log_sometimes(flag, "spillway: ", flag, " failed: ", err)
            end
        end
    end

    local function fetch()
        current()
        local res, err = post("/spillway/table", node_counters())
        if not res or res.status ~= 200 then
            log_sometimes("fetch", "spillway: decision table not fetched from ", worker.attr.runner, ": ",
                          err or ("status " .. res.status .. " " .. tostring(res.body)))
            return
        end
        local tbl, problem = table_mod.parse(res.body)
        if not tbl then
            shared_counters.add(dict(), "malformed", 1)
            log_sometimes("malformed", "spillway: the runner's decision table is refused (", problem,
                          "); the last good one stays until it is stale")
            return
        end
        local stored, err_set, room = table_mod.store(dict(), res.body)
        if not stored then
            -- The last good table stays and is served until stale; the next fetch asks the runner
            -- for one within the room there is (without some tenant rows), stored in place.
            dict():incr("store_failed", 1)
            worker.room, worker.room_until = room, ngx.now() + ROOM_HELD_S
            if (worker.logged.store or 0) + ROOM_HELD_S <= ngx.now() then
                worker.logged.store = ngx.now()
                ngx.log(ngx.ERR, "spillway: the decision table (", #res.body, " bytes) does not fit in ",
                        "the shared dict spillway (", err_set, "); the last one stays and the runner ",
                        "is asked for one within ", room, " bytes, without tenant rows that do not ",
                        "fit; make the dict larger (nginx_config.http.custom_lua_shared_dict)")
            end
            return
        end
        if worker.room and ngx.now() >= worker.room_until then
            worker.room = nil  -- try the whole table again: the dict may have room by now
        end
        shared_counters.add(dict(), "version", 1)
    end

    local function flush()
        local agg = worker.agg
        if agg.n == 0 then
            return
        end
        worker.agg = report.new()
        local res, err = post("/spillway/fast-outcomes", cjson.encode(report.body(agg)))
        if not res or res.status >= 300 then
            shared_counters.add(dict(), "dropped", agg.n)
            log_sometimes("flush", "spillway: outcomes of ", agg.n, " requests not delivered to ",
                          worker.attr.runner, ": ", err or ("status " .. res.status .. " " .. tostring(res.body)))
        end
    end

    if ngx.worker.id() == 0 then
        table_mod.prepare(dict())
        dict():safe_add("store_failed", 0)
        ngx.timer.every(worker.attr.fetch_interval_s, guarded("fetching", fetch))
        ngx.timer.at(0, guarded("fetching", fetch))
    end
    ngx.timer.every(worker.attr.batch_s, guarded("flushing", flush))
end

return _M
