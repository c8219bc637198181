-- An operator's content pattern on the fast path: the program gateway_plugin/content/program.py
-- compiles (a Thompson NFA over bytes), run as a DFA built lazily, state by state, as texts need it.
--
-- PCRE backtracks: its match limit stops a search only after work that grows with the text, and
-- one ngx.re call on 64 KiB can hold the worker for seconds. Here every byte of a text costs one
-- table lookup, or, the first time a state meets a byte, one new state: a pass over at most the
-- program's instructions. States are kept per program (at most MAX_STATES; past that they are
-- dropped and built again), so a pattern's steady cost is the lookup. search() looks at the
-- scan's budget every CHECK_BYTES bytes and every CHECK_BUILDS new states, so a pattern whose
-- states never repeat (a[ab]{20}(?:c|d) over random a and b) runs out of budget, not of time.
--
-- A byte costs a few ns here (each lookup waits on the last), where PCRE skips to the bytes a
-- match may start with; so the program carries byte sets every match holds one after the other
-- (EMP-, or [A-Z][A-Z][0-9]... for [A-Z]{2}[0-9]{7}), looked for first: a literal with
-- string.find, else with ngx.re.find as classes in a row, which PCRE has nothing to backtrack
-- over (no quantifier, no alternative: at most their count of steps from each byte). A text
-- without them cannot match, and the automaton does not run.
--
-- A state is the set of instructions waiting for the next byte and what the byte before it was
-- (none, a newline, a word byte, another): the positions ^ $ \A \z \b \B are decided when the
-- next byte is known, as the closure over the state is taken for it. A match is found as soon as
-- the closure reaches the match instruction; the start instruction joins every closure, so a
-- match may start anywhere. The program's syntax and its meaning are RE2's (content_syntax.py);
-- the runner runs the same patterns on RE2.

local new_tab = require("table.new")
local byte, sub, find, char, format = string.byte, string.sub, string.find, string.char, string.format
local re_find = ngx.re.find
local tonumber, concat, sort, ipairs, floor = tonumber, table.concat, table.sort, ipairs, math.floor
local band, lshift = bit.band, bit.lshift

-- A state's transitions take about 2 KiB: at most 256 states, about 0.6 MiB, per program and
-- worker, and at most MAX_PROGRAMS programs kept (a config names a few).
local _M = { MAX_STATES = 256, CHECK_BYTES = 8192, CHECK_BUILDS = 8, MAX_PROGRAMS = 64 }

local BYTE, SPLIT, ASSERT, MATCH = 0, 1, 2, 3
-- What is before or after a position: nothing (the text's start or end), a newline, a word byte
-- ([0-9A-Za-z_]) or another byte.
local EDGE, NEWLINE, WORD, OTHER = 0, 1, 2, 3
local CLASS = {}
for c = 0, 255 do
    CLASS[c] = (c == 10 and NEWLINE) or (find(char(c), "^[0-9A-Za-z_]$") and WORD) or OTHER
end

-- content_syntax.ASSERTIONS, in order: wb, nwb, bot, eot, bol, eol.
local function holds(kind, before, after)
    if kind == 0 then
        return (before == WORD) ~= (after == WORD)
    elseif kind == 1 then
        return (before == WORD) == (after == WORD)
    elseif kind == 2 then
        return before == EDGE
    elseif kind == 3 then
        return after == EDGE
    elseif kind == 4 then
        return before == EDGE or before == NEWLINE
    end
    return after == EDGE or after == NEWLINE
end

local MATCHED = { t = {} }  -- where a byte leads once a match is found

-- t: where each byte leads (byte c at c + 1, the array part), filled as bytes come.
local function state(pcs, before)
    return { pcs = pcs, before = before, t = new_tab(256, 0), at_end = nil }
end

local function flush(prog)
    prog.states, prog.count = {}, 0
    prog.initial = state({}, EDGE)
end

local function sets_of(hex)
    local sets = {}
    for k = 1, #hex, 64 do
        local set = {}
        for d = 0, 63 do
            local v = tonumber(sub(hex, k + d, k + d), 16)
            for j = 0, 3 do
                if band(v, lshift(1, j)) ~= 0 then
                    set[d * 4 + j] = true
                end
            end
        end
        sets[#sets + 1] = set
    end
    return sets
end

-- A byte set as a PCRE class of \xhh ranges (PCRE reads bytes here: no UTF-8 mode).
local function class_of(set)
    local parts, c = {}, 0
    while c <= 255 do
        if set[c] then
            local last = c
            while last < 255 and set[last + 1] do
                last = last + 1
            end
            parts[#parts + 1] = format(last > c and "\\x%02x-\\x%02x" or "\\x%02x", c, last)
            c = last
        end
        c = c + 1
    end
    if #parts == 0 then
        return "[^\\x00-\\xff]"  -- no byte: [^\x00-\xff] in the pattern
    end
    return "[" .. concat(parts) .. "]"
end

-- The prefilter, as the runner chose it: byte sets every match holds one after the other. When
-- each is one byte, the literal string.find looks for; else the PCRE of their classes in a row.
local function prefilter_of(indices, sets)
    local literal, classes, plain = {}, {}, true
    for index in indices:gmatch("%d+") do
        local set = sets[tonumber(index) + 1]
        if not set then
            return nil, nil, false
        end
        local only, count = nil, 0
        for c = 0, 255 do
            if set[c] then
                only, count = c, count + 1
            end
        end
        plain = plain and count == 1
        literal[#literal + 1] = only and char(only) or ""
        classes[#classes + 1] = class_of(set)
    end
    if #classes == 0 then
        return nil, nil, true
    end
    if plain then
        return concat(literal), nil, true
    end
    return nil, concat(classes), true
end

-- The program in its encoded form, checked; nil when it is malformed.
local function parse(text)
    local hex, start, code, first = text:match("^(%x*):(%d+):([%d ]*):([%d ]*)$")
    if not hex or #hex % 64 ~= 0 then
        return nil
    end
    local sets, n = sets_of(hex), 0
    local op, a, b = {}, {}, {}
    for num in code:gmatch("%d+") do
        local pc, field = floor(n / 3), n % 3
        local v = tonumber(num)
        if field == 0 then op[pc] = v elseif field == 1 then a[pc] = v else b[pc] = v end
        n = n + 1
    end
    local m = n / 3
    start = tonumber(start)
    if n == 0 or n % 3 ~= 0 or start >= m then
        return nil
    end
    for pc = 0, m - 1 do
        local o, x, y = op[pc], a[pc], b[pc]
        local ok = (o == BYTE and x < #sets and y < m) or (o == SPLIT and x < m and y < m)
            or (o == ASSERT and x <= 5 and y < m) or o == MATCH
        if not ok then
            return nil
        end
        if o == BYTE then
            a[pc] = sets[x + 1]
        end
    end
    local literal, classes, ok = prefilter_of(first, sets)
    if not ok then
        return nil
    end
    local prog = { op = op, a = a, b = b, start = start, m = m, mark = {}, gen = 0,
                   literal = literal, classes = classes }
    flush(prog)
    return prog
end

local programs, programs_count = {}, 0

-- The program ready to run, kept per worker across tables (its states with it); nil if malformed.
function _M.compile(text)
    local prog = programs[text]
    if prog then
        return prog
    end
    prog = parse(text)
    if prog then
        if programs_count >= _M.MAX_PROGRAMS then
            programs, programs_count = {}, 0
        end
        programs[text], programs_count = prog, programs_count + 1
    end
    return prog
end

-- The closure of st: every instruction reached from st's and the start, with what follows the
-- position (after) deciding the assertions; MATCHED when it reaches the match. consume(acc, set,
-- next) is called for each byte instruction reached.
local function closure(prog, st, after, consume, acc)
    local op, a, b, mark = prog.op, prog.a, prog.b, prog.mark
    local gen = prog.gen + 1
    prog.gen = gen
    local stack, top = { prog.start }, 1
    for _, pc in ipairs(st.pcs) do
        top = top + 1
        stack[top] = pc
    end
    while top > 0 do
        local pc = stack[top]
        top = top - 1
        if mark[pc] ~= gen then
            mark[pc] = gen
            local o = op[pc]
            if o == MATCH then
                return MATCHED
            elseif o == SPLIT then
                stack[top + 1], stack[top + 2] = a[pc], b[pc]
                top = top + 2
            elseif o == ASSERT then
                if holds(a[pc], st.before, after) then
                    top = top + 1
                    stack[top] = b[pc]
                end
            elseif consume then
                consume(acc, a[pc], b[pc])
            end
        end
    end
    return nil
end

local function consume(acc, set, next_pc)
    if set[acc.c] and not acc.seen[next_pc] then
        acc.seen[next_pc] = true
        acc.pcs[#acc.pcs + 1] = next_pc
    end
end

-- Where byte c leads from st: a state (made and kept when new), or MATCHED.
local function step(prog, st, c)
    local after = CLASS[c]
    local acc = { c = c, seen = {}, pcs = {} }
    if closure(prog, st, after, consume, acc) == MATCHED then
        st.t[c + 1] = MATCHED
        return MATCHED
    end
    local pcs = acc.pcs
    sort(pcs)
    local key = after .. ":" .. concat(pcs, ",")
    local nxt = prog.states[key]
    if nxt == nil then
        if prog.count >= _M.MAX_STATES then
            flush(prog)
        end
        nxt = state(pcs, after)
        prog.states[key], prog.count = nxt, prog.count + 1
    end
    st.t[c + 1] = nxt
    return nxt
end

local function at_end(prog, st)
    if st.at_end == nil then
        st.at_end = closure(prog, st, EDGE, nil, nil) == MATCHED
    end
    return st.at_end
end

-- Whether the program matches anywhere in text: true or false; nil once over(budget) says the
-- budget is spent (looked at every CHECK_BYTES bytes and every CHECK_BUILDS new states).
function _M.search(prog, text, over, budget)
    if prog.literal and not find(text, prog.literal, 1, true) then
        return false
    end
    if prog.classes then
        local at, _, err = re_find(text, prog.classes, "jo")
        if at == nil and err == nil then
            return false
        end
    end
    local st = prog.initial
    local t = st.t
    local n, built, check_at = #text, 0, _M.CHECK_BYTES
    for i = 1, n do
        local c = byte(text, i)
        local nxt = t[c + 1]
        if nxt == nil then
            nxt = step(prog, st, c)
            built = built + 1
            if built % _M.CHECK_BUILDS == 0 and over(budget) then
                return nil
            end
        end
        if nxt == MATCHED then
            return true
        end
        st, t = nxt, nxt.t
        if i >= check_at then
            check_at = check_at + _M.CHECK_BYTES
            if over(budget) then
                return nil
            end
        end
    end
    return at_end(prog, st)
end

return _M
