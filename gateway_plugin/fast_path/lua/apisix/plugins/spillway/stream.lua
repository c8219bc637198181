-- A stream of generated tokens (Triton's generate_stream) and its bill.
--
-- Its events are counted as they go by: one per token, so the stream is settled at the tokens it
-- sent, by the runner on the ext-plugin route (the spillway_tokens variable, in the outcome the
-- logger reports) and by the fast path's plugin in its log phase (bill). An event ends at a blank
-- line; a chunk may end inside one, so the last two bytes of each chunk that no blank line took
-- are searched again with the next (a blank line ending in them is not counted twice, nor is a
-- line end it took counted again). Nothing is kept of the body beyond those two bytes.

local core = require("apisix.core")
local C = require("apisix.plugins.spillway.contract")
local counters = require("apisix.plugins.spillway.counters")

local ngx = ngx
local find, sub, lower, byte = string.find, string.sub, string.lower, string.byte
local type, tonumber, ceil, floor, max = type, tonumber, math.ceil, math.floor, math.max
local SLASH = byte("/")

local _M = {}

local EVENT_STREAM = "text/event-stream"
local BLANK_LINE = "\n\r?\n"

core.ctx.register_var(C.VAR.tokens, function(ctx) return ctx.spillway_tokens end)

local SUFFIX = C.STREAM_SUFFIX
local HOUR = C.BUDGET_HOUR_S

-- Whether a request's answer is a stream (books/ledger.py's streamed; the path has no query).
function _M.streamed(path)
    local last = #path
    while last > 1 and byte(path, last) == SLASH do
        last = last - 1
    end
    return last >= #SUFFIX and sub(path, last - #SUFFIX + 1, last) == SUFFIX
end

-- What a stream that took `seconds` and sent `tokens` for a prompt of `prompt` tokens (nil: not
-- counted, the expected ones) costs at the target's price (the table's stream_usd,
-- costs.stream_price): per request, per second billed (rounded up to the millisecond, as the
-- platforms bill), per token and the tokens expected, per prompt token and those expected.
function _M.bill(price, seconds, tokens, prompt)
    return price[1] + ceil(seconds * 1000 - 1e-9) / 1000 * price[2] + (tokens or price[4]) * price[3]
        + (prompt or price[6]) * price[5]
end

-- The prompt tokens a body of `bytes` is counted as (costs.input_tokens; nil: its size unknown).
function _M.prompt_tokens(bytes)
    local n = tonumber(bytes)
    return n and ceil(max(0, n) / C.BYTES_PER_INPUT_TOKEN) or nil
end

-- header_filter: an event stream starts counting.
function _M.start(ctx)
    local content_type = ngx.header["Content-Type"]
    if type(content_type) == "string" and find(lower(content_type), EVENT_STREAM, 1, true) == 1 then
        ctx.spillway_tokens, ctx.spillway_stream_tail = 0, ""
    end
end

-- The events that end in `chunk`, given the count so far and the bytes kept before it: the new
-- count and the bytes to keep (read alike chunk by chunk or whole).
function _M.counted(count, tail, chunk)
    local text, seen = tail .. chunk, #tail
    local at = 1
    while true do
        local _, last = find(text, BLANK_LINE, at)
        if not last then
            break
        end
        if last > seen then
            count = count + 1
        end
        at = last + 1
    end
    return count, sub(text, max(at, #text - 1))
end

-- body_filter: the events that ended in this chunk.
function _M.count(ctx)
    local count = ctx.spillway_tokens
    if not count then
        return
    end
    local chunk = ngx.arg[1]
    if chunk == nil or chunk == "" then
        return
    end
    ctx.spillway_tokens, ctx.spillway_stream_tail = _M.counted(count, ctx.spillway_stream_tail, chunk)
end

-- What a stream held at `held` (its price at decision, at wall time `held_at`) and billed `bill`
-- at wall time `now` changes in its target's spend: what it cost more is spent now; what it cost
-- less is given back only while the budget's hour it was held in lasts until the runner takes the
-- give-back in, up to `delay` s later (with the next fetch or summary): taken off the hour after,
-- it would let that hour spend more than its budget. The day keeps it, which errs on the safe side.
function _M.settled(held, bill, held_at, now, delay)
    local more = bill - held
    if more >= 0 then
        return more, 0
    end
    if floor(held_at / HOUR) ~= floor((now + delay) / HOUR) then
        return 0, 0
    end
    return 0, -more
end

-- The fast path's log phase: a stream sent to a target that took `seconds` is settled at what it
-- cost in place of its price at decision (held when the request began), in the target's spend
-- this node counts (d_: what is spent and what is given back, each a counter that only grows, as
-- the runner reads them) and in the bill it reports (seen.cost). Returns what the settlement
-- changes in the budgets (the tenant's too): spent, less what was given back. `delay`: how long
-- after now the runner may take this in at the latest (link.lua's report_delay_s).
function _M.settle(d_, seen, ctx, seconds, delay)
    if not (seen.price and seconds) then
        return 0
    end
    local prompt = _M.prompt_tokens(ngx.var.content_length)
    local bill = _M.bill(seen.price, seconds, ctx.spillway_tokens, prompt)
    local spent, given_back = _M.settled(seen.cost or 0, bill, ngx.req.start_time(), ngx.now(), delay)
    if spent > 0 then
        counters.add(d_, counters.key(seen.keys.spent, seen.target), spent)
    elseif given_back > 0 then
        counters.add(d_, counters.key(seen.keys.given_back, seen.target), given_back)
    end
    seen.cost = bill
    return spent - given_back
end

return _M
