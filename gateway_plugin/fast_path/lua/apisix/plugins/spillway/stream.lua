-- The events of a streamed answer (text/event-stream) counted as they go by, for the outcome the
-- ext-plugin route's logger reports (the spillway_tokens variable): a stream of generated tokens
-- sends one event per token (Triton's generate_stream), so the runner settles the stream's bill at
-- the tokens it sent. An event ends at a blank line; a chunk may end inside one, so the last two
-- bytes of each chunk are searched again with the next, and a blank line wholly in them is not
-- counted twice. Nothing is kept of the body beyond those two bytes.

local core = require("apisix.core")
local C = require("apisix.plugins.spillway.contract")

local ngx = ngx
local find, sub, lower, type = string.find, string.sub, string.lower, type

local _M = {}

local EVENT_STREAM = "text/event-stream"
local BLANK_LINE = "\n\r?\n"

core.ctx.register_var(C.VAR.tokens, function(ctx) return ctx.spillway_tokens end)

-- header_filter: an event stream starts counting.
function _M.start(ctx)
    local content_type = ngx.header["Content-Type"]
    if type(content_type) == "string" and find(lower(content_type), EVENT_STREAM, 1, true) == 1 then
        ctx.spillway_tokens, ctx.spillway_stream_tail = 0, ""
    end
end

-- body_filter: the events that ended in this chunk.
function _M.count(ctx)
    local count = ctx.spillway_tokens
    local chunk = ngx.arg[1]
    if not count or chunk == nil or chunk == "" then
        return
    end
    local tail = ctx.spillway_stream_tail
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
    ctx.spillway_tokens, ctx.spillway_stream_tail = count, sub(text, -2)
end

return _M
