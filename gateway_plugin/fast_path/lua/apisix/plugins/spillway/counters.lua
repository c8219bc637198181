-- The plugin's shared-dict counters and their keys, made so that none of them evicts another.
--
-- A full dict evicts its least recently used keys when a key is made with set, add or incr's
-- init; the rarely touched ones (the node id, a target's spend) would go first, and with them
-- every report (no node: the runner refuses it) or the spend since the last table. So keys are
-- made only with safe_add/safe_set: when the dict is full, what cannot be counted is refused
-- (no reservation, a local decision) rather than something else forgotten.

local sha256 = require("resty.sha256")
local to_hex = require("resty.string").to_hex
local contract = require("apisix.plugins.spillway.contract")
local KEY, PREFIX = contract.KEY, contract.PREFIX

local _M = {}

-- Longest tenant name kept as sent (policy/tenants.py MAX_TENANT_BYTES on the runner's side).
local MAX_TENANT = 256

-- How long a tenant's in-flight count outlives the start of its last request, and how long one
-- that fell to zero stays (an idle tenant's key goes by itself; a delete could race a taker).
local TENANT_BUSY_S = 600
local TENANT_IDLE_S = 10

-- Clients choose tenant names: one over 256 bytes, or with a byte outside printable ASCII, is
-- keyed by the hash of its bytes, so every report, dict key and table entry stays short and goes
-- through JSON both ways unchanged (bytes that are not UTF-8 would make a summary unreadable for
-- the runner), while the tenant keeps one consistent key. The runner keys names and its quotas'
-- names the same way (gateway_plugin/policy/tenants.py).
function _M.tenant_key(name)
    if name == nil or (#name <= MAX_TENANT and not name:find("[^\32-\126]")) then
        return name
    end
    local digest = sha256:new()
    digest:update(name)
    return "sha256:" .. to_hex(digest:final())
end

-- key += by, the key made at zero if missing; nil and the error when the dict has no room.
function _M.add(d_, key, by)
    local value, err = d_:incr(key, by)
    if value ~= nil or err ~= "not found" then
        return value, err
    end
    local ok, add_err = d_:safe_add(key, 0)
    if not ok and add_err ~= "exists" then
        return nil, add_err
    end
    return d_:incr(key, by)
end

-- key -= 1 if the key is still there (a count never made anew by its release).
function _M.release(d_, key)
    return d_:incr(key, -1)
end

-- The mark is the counter as the plugin's report carried it, through cjson's 14 significant
-- digits: a counter of cents may sit a rounding below its own mark (0.12999999999999998, reported
-- as 0.13), which is the same counter, not one made anew.
local MARK_ROUNDING = 1e-12

-- A counter's growth since the mark the table was built with; one below its mark (by more than
-- the report's rounding) was made anew (evicted, nginx restarted), so all of it is new: never
-- negative, never less than was spent.
function _M.since_mark(total, mark)
    if total >= mark - MARK_ROUNDING * math.max(1, math.abs(mark)) then
        return math.max(0, total - mark)
    end
    return total
end

-- A tenant's in-flight count after taking one slot; nil (and the error) when not counted.
function _M.take_tenant(d_, key)
    local count, err = _M.add(d_, key, 1)
    if count ~= nil then
        d_:expire(key, TENANT_BUSY_S)
    end
    return count, err
end

function _M.release_tenant(d_, key)
    local left = d_:incr(key, -1)
    if left ~= nil and left <= 0 then
        d_:expire(key, TENANT_IDLE_S)
        if (d_:get(key) or 0) > 0 then
            d_:expire(key, TENANT_BUSY_S)  -- taken again meanwhile: its taker's expiry stands
        end
    end
end

-- The dict keys of targets' and models' counters (names from the table, so few), each made once
-- per table version rather than concatenated per request; tenants' keys (clients choose them) are
-- not kept. A ring holds its prefix at [1] (no name is a number).
function _M.keys()
    return { inflight = { PREFIX.in_flight }, spent = { PREFIX.spent }, given_back = { PREFIX.given_back },
             probe = { PREFIX.probe },
             cold = { PREFIX.in_flight_cold }, local_ = { PREFIX.local_in_flight }, hot = { PREFIX.hot } }
end

function _M.key(ring, name)
    local k = ring[name]
    if k == nil then
        k = ring[1] .. name
        ring[name] = k
    end
    return k
end

-- The node's id, made anew (a new node for the runner, so no spend is lost) when evicted.
function _M.node(d_)
    local node = d_:get(KEY.node)
    if node == nil then
        d_:safe_add(KEY.node, ngx.worker.pid() .. "-" .. ngx.now())
        node = d_:get(KEY.node)
    end
    return node
end

return _M
