-- What counts as sensitive text: gateway_plugin/content/detectors.py in Lua.
--
-- The detectors come in the decision table, in the order they are tried: card and iban (a run of
-- digits or words found by a regex, then a checksum: Luhn, ISO 13616 mod 97), search (a built-in
-- regex, run once over every text joined by NUL bytes, which none of them matches across) and
-- pattern (an operator's regex, run over each text on its own). Built-in regexes run on PCRE over
-- the texts' bytes, without UTF-8 mode: the same bytes and the same ASCII classes Python's re
-- reads. An operator's pattern runs as the program the runner compiled from it, on dfa.lua (a
-- linear-time automaton; the runner runs the pattern on RE2, which reads it alike). So every
-- detector finds what the runner's finds.
--
-- A scan has a CPU budget (the table's budget_ms): budget() starts it, read() is told how much
-- text each step read and looks at this worker's CPU clock every CHECK_BYTES of it; dfa.search
-- looks at it too as it goes. Past the budget the scan stops and says why ("over_budget"); so
-- does a built-in regex PCRE gives up on (its match limit, lua_regex_match_limit): the request
-- stays home.

local ffi = require("ffi")
local contract = require("apisix.plugins.spillway.contract")
local dfa = require("apisix.plugins.spillway.dfa")
local re_find, re_gmatch = ngx.re.find, ngx.re.gmatch
local byte, sub, upper, gsub = string.byte, string.sub, string.upper, string.gsub
local concat = table.concat
local ipairs, type, tonumber, pcall = ipairs, type, tonumber, pcall


-- Kept in step with content_detectors.py (the table carries the search patterns themselves).
-- content_detectors.CARD_RUN: one separator (CARD_SEPARATOR) between two digits, the wide ones
-- tried only after a byte that starts one.
local CARD_RUN = [=[[0-9](?:[\t\n\x0b\x0c\x1c-\x1f -]?[0-9]]=]
    .. [=[|(?=[\r\xc2\xe1-\xe3\xef])(?:\r\n?|\xc2[\x85\xa0\xad]|\xe1(?:\x9a\x80|\xa0\x8e)]=]
    .. [=[|\xe2(?:\x80[\x80-\x95\xa8-\xaf]|\x81[\x9f-\xaf]|\x88\x92)]=]
    .. [=[|\xe3\x80\x80|\xef(?:\xb9[\x98\xa3]|\xbc\x8d|\xbb\xbf))[0-9]){12,}]=]
local IBAN_RUN = [=[(?<![A-Za-z0-9])[A-Za-z]{2}[0-9]{2}(?: ?[A-Za-z0-9])+]=]
local DOUBLED = { [0] = 0, 2, 4, 6, 8, 1, 3, 5, 7, 9 }

local _M = { JOIN = "\0", CHECK_BYTES = 8192, OVER_BUDGET = contract.UNSCANNABLE.over_budget }

-- This worker's CPU time (nginx workers are single-threaded), read the way no other cdef can clash with.
pcall(ffi.cdef, [[
typedef struct { long sec; long nsec; } spillway_cpu_time;
int spillway_clock_gettime(int clock, spillway_cpu_time *t) __asm__("clock_gettime");
]])
local CLOCK_THREAD_CPUTIME_ID = 3
local cpu_time = ffi.new("spillway_cpu_time")

local function cpu_now()
    ffi.C.spillway_clock_gettime(CLOCK_THREAD_CPUTIME_ID, cpu_time)
    return tonumber(cpu_time.sec) + tonumber(cpu_time.nsec) * 1e-9
end

-- A scan's budget, from now: budget_ms of CPU.
function _M.budget(budget_ms)
    return { deadline = cpu_now() + budget_ms / 1000, unchecked = 0 }
end

local function over(budget)
    return cpu_now() > budget.deadline
end
_M.over = over

-- size more bytes read: true once the budget is spent (looked at every CHECK_BYTES).
local function read(budget, size)
    local unchecked = budget.unchecked + size
    if unchecked < _M.CHECK_BYTES then
        budget.unchecked = unchecked
        return false
    end
    budget.unchecked = 0
    return over(budget)
end
_M.read = read

local function luhn(digits)
    local total, n = 0, #digits
    for i = n, 1, -1 do
        local d = byte(digits, i) - 48
        if (n - i) % 2 == 1 then
            d = DOUBLED[d]
        end
        total = total + d
    end
    return total % 10 == 0
end
_M.luhn = luhn

local function card_number(digits)
    return #digits >= 13 and #digits <= 19 and luhn(digits)
end

-- Whether holds(run) for any run of text the regex finds: true or false; nil when PCRE gave up
-- (its match limit) before one held. A for loop over re_gmatch would end there silently, and read
-- as nothing found.
local function any_run(blob, pattern, holds)
    local next_run = re_gmatch(blob, pattern, "jo")
    if not next_run then
        return nil
    end
    while true do
        local m, err = next_run()
        if err then
            return nil
        elseif not m then
            return false
        elseif holds(m[0]) then
            return true
        end
    end
end

local function card_run(text)
    local digits = gsub(text, "[^0-9]", "")
    if card_number(digits) then
        return true
    end
    if #digits ~= #text then
        for group in text:gmatch("[0-9]+") do
            if card_number(group) then
                return true
            end
        end
    end
    return false
end

local function mod97(iban)
    local remainder = 0
    local moved = sub(iban, 5) .. sub(iban, 1, 4)
    for i = 1, #moved do
        local c = byte(moved, i)
        if c <= 57 then
            remainder = (remainder * 10 + c - 48) % 97
        else
            remainder = (remainder * 100 + c - 55) % 97
        end
    end
    return remainder == 1
end
_M.mod97 = mod97

-- An IBAN starting at word start: that word alone, or it and the groups of four after it (the
-- last of 1 to 4 characters).
local function iban_from(tokens, start)
    local head = tokens[start]
    if #head >= 15 and #head <= 34 and mod97(head) then
        return true
    end
    if #head ~= 4 then
        return false
    end
    local joined = head
    for i = start + 1, #tokens do
        local group = tokens[i]
        if #group < 1 or #group > 4 or #joined + #group > 34 then
            return false
        end
        joined = joined .. group
        if #joined >= 15 and mod97(joined) then
            return true
        end
        if #group < 4 then
            return false
        end
    end
    return false
end

local function iban_run(text)
    local tokens = {}
    for token in upper(text):gmatch("[^ ]+") do
        tokens[#tokens + 1] = token
    end
    for i, token in ipairs(tokens) do
        if token:find("^%u%u%d%d") and iban_from(tokens, i) then
            return true
        end
    end
    return false
end

local CHECKS = {
    card = function(blob) return any_run(blob, CARD_RUN, card_run) end,
    iban = function(blob) return any_run(blob, IBAN_RUN, iban_run) end,
}

-- Whether the detector finds anything: true or false; nil once the budget is spent, or when PCRE
-- gave up on a built-in regex (its match limit): text that could not be read through stays home.
local function finds(d, texts, blob, budget)
    if d.kind ~= "pattern" then
        local found, check = false, CHECKS[d.kind]
        if check then
            found = check(blob)
            if found == nil then
                return nil
            end
        else
            local from, _, err = re_find(blob, d.pattern, "jo")
            if err then
                return nil
            end
            found = from ~= nil
        end
        if found then
            return true
        end
        if read(budget, #blob) then
            return nil
        end
        return false
    end
    for _, text in ipairs(texts) do
        local found = dfa.search(d.automaton, text, over, budget)
        if found ~= false then
            return found
        end
        if read(budget, #text) then
            return nil
        end
    end
    return false
end

-- The name of the first detector, in order, that finds something in any text; nil when none
-- does; nil and OVER_BUDGET when the budget ran out (or PCRE gave up) before one found something.
function _M.first_found(detectors, texts, budget)
    if #texts == 0 then
        return nil
    end
    local blob = concat(texts, _M.JOIN)
    for _, d in ipairs(detectors) do
        local found = finds(d, texts, blob, budget)
        if found then
            return d.name
        elseif found == nil then
            return nil, _M.OVER_BUDGET
        end
    end
    return nil
end

-- A table's detectors made ready: an operator's pattern's program compiled (dfa.lua, kept per
-- worker across tables). False when a program is malformed.
function _M.compile(detectors)
    for _, d in ipairs(detectors) do
        if d.kind == "pattern" then
            d.automaton = type(d.program) == "string" and dfa.compile(d.program) or nil
            if not d.automaton then
                return false
            end
        end
    end
    return true
end

return _M
