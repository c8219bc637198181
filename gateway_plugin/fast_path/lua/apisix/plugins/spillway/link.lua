-- The plugins' link to the runner: where it is (plugin_attr.spillway), whether it still answers,
-- and, for the fast path, the decision table one worker fetches (POSTing this node's counters:
-- spend per target, the overflow flag it last decided, fail-safe decisions, dropped outcomes,
-- what content checks found, tables it could not store and the room it has) into the shared dict (table.lua says how), and
-- the summaries of outcomes every worker posts.
--
-- Whether it answers: one worker asks GET /spillway/alive every alive_interval_s (the runner
-- answers from the event loop that serves APISIX's calls). A runner that answered before and has
-- been silent for dead_after_s is treated as dead: the ext-plugin route answers 503 at once
-- rather than let each request wait out ext-plugin's 60 s socket timeout. Silent for kill_after_s,
-- it is stopped with SIGKILL (after checking the pid still names the process that answered), so
-- APISIX starts it anew, as it does a runner that died: requests it held get their 503 then.

local core = require("apisix.core")
local plugin = require("apisix.plugin")
local cjson = require("cjson.safe")
local ffi = require("ffi")
local hmac = require("resty.hmac")
local http = require("resty.http")
local contract = require("apisix.plugins.spillway.contract")
local table_mod = require("apisix.plugins.spillway.table")
local report = require("apisix.plugins.spillway.report")
local shared_counters = require("apisix.plugins.spillway.counters")

local ngx = ngx
local pairs, pcall, tostring, type = pairs, pcall, tostring, type
-- How long a table is asked to fit the room left after a store failed, before a whole one is tried.
local ROOM_HELD_S = 10
local PREFIX, KEY, ALIVE = contract.PREFIX, contract.KEY, contract.PREFIX.alive
local UNSCANNABLE = require("apisix.plugins.spillway.content").UNSCANNABLE

local _M = {}

local SIGKILL = 9
pcall(ffi.cdef, "int kill(int pid, int sig);")

local attr_schema = {
    type = "object",
    properties = {
        runner = { type = "string", default = "127.0.0.1:9092",
                   description = "host:port of the runner's outcome endpoint (outcomes.listen)" },
        token_env = { type = "string", default = "SPILLWAY_ROUTE_TOKEN" },
        fetch_interval_s = { type = "number", minimum = 0.01, maximum = 1, default = 0.05 },
        stale_after_s = { type = "number", exclusiveMinimum = 0, default = 1 },
        timeout_s = { type = "number", exclusiveMinimum = 0, default = 0.5 },
        batch_s = { type = "number", minimum = 0.05, maximum = 60, default = 0.2 },
        alive_interval_s = { type = "number", minimum = 0.05, maximum = 10, default = 0.5 },
        dead_after_s = { type = "number", exclusiveMinimum = 0, default = 2 },
        kill_after_s = { type = "number", exclusiveMinimum = 0, default = 5 },
    },
}

-- plugin_attr.spillway, checked, and the Authorization the runner's endpoint wants; nil when the
-- attributes are invalid (logged).
function _M.settings()
    local attr = core.table.deepcopy(plugin.plugin_attr(contract.PLUGIN) or {})
    local ok, err = core.schema.check(attr_schema, attr)
    if not ok then
        core.log.error("spillway: plugin_attr.spillway is invalid: ", err)
        return nil
    end
    -- The latest a count made now reaches the runner (while the last exchange lasts): one that
    -- began just before may take its timeout, and the next, a tick later, may take its own.
    attr.report_delay_s = math.max(attr.fetch_interval_s, attr.batch_s) + 2 * attr.timeout_s
    local token = os.getenv(attr.token_env) or ""
    if #token < contract.TOKEN.min_len then
        core.log.error("spillway: ", attr.token_env, " must hold the route token (at least ", contract.TOKEN.min_len, " ",
                       "characters; nginx_config.envs must name it); without it the runner cannot ",
                       "be asked: no table is fetched (every request stays local) and no runner is ",
                       "watched")
    end
    local mac = hmac:new(token, hmac.ALGOS.SHA256):final(contract.TOKEN.auth_label, true)
    return attr, "Spillway " .. mac:sub(1, 32)
end

-- The start time (clock ticks since boot) of process pid, as the runner reports its own.
local function started_of(pid)
    local f = io.open("/proc/" .. pid .. "/stat", "r")
    if not f then
        return nil
    end
    local text = f:read("*a")
    f:close()
    local rest = text:match(".*%)%s(.*)$")
    local i = 0
    for field in (rest or ""):gmatch("%S+") do
        i = i + 1
        if i == 20 then
            return field
        end
    end
    return nil
end

local function stop(d_, pid, started, attr)
    d_:delete(ALIVE .. "pid")
    if started == nil or started == "" or started_of(pid) ~= started then
        return  -- gone already, or the pid now names another process
    end
    local ok = ffi.C.kill(pid, SIGKILL) == 0
    core.log.error("spillway: the runner (pid ", pid, ") has not answered for ", attr.kill_after_s,
                   " s; ", ok and "stopped it (SIGKILL): APISIX starts it anew"
                         or ("could not stop it (errno " .. ffi.errno() .. ")"))
end

local function probe(attr, auth, d_)
    local httpc = http.new()
    httpc:set_timeout(attr.timeout_s * 1000)
    local res = httpc:request_uri("http://" .. attr.runner .. contract.PATH.alive, {
        method = "GET", headers = { ["Authorization"] = auth }, keepalive_timeout = 60000,
    })
    local now = ngx.now()
    local seen = res and res.status == 200 and cjson.decode(res.body)
    if type(seen) == "table" and type(seen.pid) == "number" then
        d_:safe_set(ALIVE .. "at", now)
        d_:safe_set(ALIVE .. "pid", seen.pid)
        d_:safe_set(ALIVE .. "started", tostring(seen.started or ""))
        return
    end
    local at, pid = d_:get(ALIVE .. "at"), d_:get(ALIVE .. "pid")
    if at and pid and now - at > attr.kill_after_s then
        stop(d_, pid, d_:get(ALIVE .. "started"), attr)
    end
end

local watching = false

-- Worker 0 asks the runner whether it answers (once, whichever plugin calls it first).
function _M.watch(attr, auth, d_)
    if watching or ngx.get_phase() ~= "init_worker" or ngx.worker.id() ~= 0 then
        return
    end
    watching = true
    ngx.timer.every(attr.alive_interval_s, function(premature)
        if not premature then
            local ok, err = pcall(probe, attr, auth, d_)
            if not ok then
                core.log.warn("spillway: asking the runner whether it answers failed: ", err)
            end
        end
    end)
end

-- Seconds since the runner last answered; nil before it ever did.
function _M.silent_for(d_)
    local at = d_:get(ALIVE .. "at")
    return at and ngx.now() - at or nil
end

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

    -- The counters as the runner took them in when it built the table held (book.py's marks).
    local function marks(targets)
        local out = {}
        for name, spec in pairs(targets) do
            out[name] = { spec.spent_mark, spec.given_back_mark }
        end
        return out
    end

    local function node_counters()
        local tbl = worker.tbl
        local targets, models = tbl and tbl.targets or {}, tbl and tbl["local"] or {}
        local d_ = dict()
        return cjson.encode({
            node = shared_counters.node(d_),
            marks = marks(targets),
            spent = counters(PREFIX.spent, targets),
            given_back = counters(PREFIX.given_back, targets),
            hot = counters(PREFIX.hot, models),
            content = counters(PREFIX.content_match, tbl and tbl.content.names or {}),
            unscannable = counters(PREFIX.content_unscannable, UNSCANNABLE),
            fail_safe = d_:get(KEY.fail_safe) or 0,
            dropped = d_:get(KEY.dropped) or 0,
            store_failed = d_:get(KEY.store_failed) or 0,
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
        local res, err = post(contract.PATH.table, node_counters())
        if not res or res.status ~= 200 then
            log_sometimes("fetch", "spillway: decision table not fetched from ", worker.attr.runner, ": ",
                          err or ("status " .. res.status .. " " .. tostring(res.body)))
            return
        end
        local tbl, problem = table_mod.parse(res.body)
        if not tbl then
            shared_counters.add(dict(), KEY.malformed, 1)
            log_sometimes("refused", "spillway: the runner's decision table is refused (", problem,
                          "); the last good one stays until it is stale")
            return
        end
        local stored, err_set, room = table_mod.store(dict(), res.body)
        if not stored then
            -- The last good table stays and is served until stale; the next fetch asks the runner
            -- for one within the room there is (without some tenant rows), stored in place.
            dict():incr(KEY.store_failed, 1)
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
        shared_counters.add(dict(), KEY.version, 1)
    end

    local function flush()
        local agg = worker.agg
        if not report.pending(agg) then
            return
        end
        worker.agg = report.new()
        local res, err = post(contract.PATH.outcomes, cjson.encode(report.body(agg)))
        if not res or res.status >= 300 then
            shared_counters.add(dict(), KEY.dropped, agg.n)
            log_sometimes("flush", "spillway: outcomes of ", agg.n, " requests not delivered to ",
                          worker.attr.runner, ": ", err or ("status " .. res.status .. " " .. tostring(res.body)))
        end
    end

    if ngx.worker.id() == 0 then
        table_mod.prepare(dict())
        dict():safe_add(KEY.store_failed, 0)
        ngx.timer.every(worker.attr.fetch_interval_s, guarded("fetching", fetch))
        ngx.timer.at(0, guarded("fetching", fetch))
    end
    ngx.timer.every(worker.attr.batch_s, guarded("flushing", flush))
end

return _M
