"""Where the fast path's time and memory go per request, step by step, inside a real APISIX.

The checkout's Lua plugin is copied twice and instrumented: each phase (access, header_filter,
log) and each step of the access phase (the one reading, the body, the table, the features, the
decision with its reservation, the account, ...) adds what it took to a sum per step, read either
from the monotonic clock (``time``: ns per request, the clock's own reads included, about 50 ns
a step) or from LuaJIT's heap with its collector stopped (``bytes``: bytes allocated per request;
a timer collects every 2 s). Each worker logs its sums every 2 s. Both copies run as
``bench/apisix_gateway.py`` variants of ``fast-local`` and ``fast-cloud``, interleaved with the
checkout's own (whose figures say what the instruments cost) and ``noop``, the no-op plugin
(what any plugin costs: its APISIX CPU per request is the reference).

What the steps do not hold is outside the plugin's functions: APISIX and nginx around them, and
the collection of the garbage they leave (``bytes``), which LuaJIT does wherever it allocates.

    python bench/fast_path_steps.py [--rounds 3] [--seconds 5] [--prefix DIR] [--json-out F]

Needs what ``bench/apisix_gateway.py`` needs (APISIX in a prefix of its own, wrk, nginx).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import apisix_gateway as gw
from harness import Output, add_output_options, machine_note

from gateway_plugin.fast_path.route import LUA_DIR

PLUGIN = Path("apisix") / "plugins" / "spillway.lua"
# Each step of the access phase ends with this statement (stripped); the bench refuses a plugin
# that no longer has one, so that a step never silently measures nothing.
STEPS = (
    ("local raw, path, odd = edge.admit(ctx)", "one reading"),
    ("edge.read_body()  -- before anything is counted: a slow client holds nothing meanwhile", "body"),
    ("local tbl = current(now)", "table"),
    ("local f = decide.features(path, raw, core.request.get_uri_args, ctx)", "features"),
    ("policy = route_policy(tbl, conf)", "route policy"),
    ("local status, why = edge.settle(ctx, raw, odd, policy.read, policy.tenant_header)", "settle"),
    ("keyed_tenant(f, policy.tenant_header)", "identity and tenant"),
    ("local reserved = reserving.tenant(f, policy, log_sometimes)", "tenant slot"),
    ("kept_by = check_content(ctx, f, tbl, policy)", "content"),
    ("d = decide_and_reserve(f, tbl, policy)", "decision and reservation"),
    ("account(ctx, d, f, tbl, policy, kept_by)", "account"),
    ("edge.pin_path(ctx)", "pin path"),
)
PHASES = ("access", "header_filter", "log")
# What the access phase does after its last step: a cloud decision's signature and upstream.
AFTER = "after the steps (cloud: signing)"
_KEY = {name.replace(" ", "_"): name for name in [*PHASES, *(n for _, n in STEPS), AFTER]}

_PRELUDE = """
local __ffi = require("ffi")
pcall(__ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } spillway_bench_ts;"
                  .. " int clock_gettime(int, spillway_bench_ts *);")
local __ts = __ffi.new("spillway_bench_ts")
local __BYTES = %(bytes)s
local function __read()
    if __BYTES then
        return collectgarbage("count") * 1024
    end
    __ffi.C.clock_gettime(1, __ts)
    return tonumber(__ts.tv_sec) * 1e9 + tonumber(__ts.tv_nsec)
end
local __sums, __n, __last = {}, 0, 0
local function __step(name)
    local now = __read()
    __sums[name] = (__sums[name] or 0) + (now - __last)
    __last = __read()
end
"""

_EPILOGUE = """
for _, phase in ipairs({ %(phases)s }) do
    local inner = _M[phase]
    _M[phase] = function(conf, ctx)
        local began = __read()
        __last = began
        local a, b = inner(conf, ctx)
        local now = __read()
        __sums[phase] = (__sums[phase] or 0) + (now - began)
        if phase == "access" then
            __sums["%(after)s"] = (__sums["%(after)s"] or 0) + (now - __last)
        elseif phase == "log" then
            __n = __n + 1
        end
        return a, b
    end
end
local __init = _M.init
_M.init = function()
    __init()
    if ngx.get_phase() ~= "init_worker" then
        return
    end
    if __BYTES then
        collectgarbage("stop")
    end
    local function tick()
        local parts = { "SPILLWAY-BENCH-STEPS", __BYTES and "bytes" or "time", "n=" .. __n }
        for name, sum in pairs(__sums) do
            parts[#parts + 1] = name:gsub(" ", "_") .. "=" .. string.format("%%.0f", sum)
            __sums[name] = 0
        end
        __n = 0
        ngx.log(ngx.WARN, table.concat(parts, " "))
        if __BYTES then
            collectgarbage("collect")
            collectgarbage("stop")
        end
        ngx.timer.at(2, tick)
    end
    ngx.timer.at(2, tick)
end
return _M
"""


def instrument(source: str, measure_bytes: bool) -> str:
    """The plugin's source with its steps and phases summed (see the module's docstring)."""
    out: list[str] = []
    missing = dict(STEPS)
    inside = False
    for line in source.splitlines():
        out.append(line)
        inside = (inside or line == "function _M.access(conf, ctx)") and line != "end"
        name = missing.pop(line.strip(), None) if inside else None
        if name is not None:
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f'{indent}__step("{name}")')
    if missing:
        raise SystemExit(f"the plugin has no step ending with: {', '.join(missing)}; update STEPS")
    text = "\n".join(out) + "\n"
    head = text.index("\nlocal _M")
    text = text[:head] + _PRELUDE % {"bytes": "true" if measure_bytes else "false"} + text[head:]
    tail = text.rindex("\nreturn _M")
    phases = ", ".join(f'"{phase}"' for phase in PHASES)
    return text[:tail] + _EPILOGUE % {"after": AFTER, "phases": phases}


def variant(work: Path, name: str, measure_bytes: bool) -> Path:
    root = work / name
    shutil.copytree(LUA_DIR, root)
    plugin = root / PLUGIN
    plugin.write_text(instrument(plugin.read_text(), measure_bytes))
    return root


_LINE = re.compile(r"\] (\d+)#.*SPILLWAY-BENCH-STEPS (time|bytes) n=(\d+)((?: \S+=-?\d+)*)")


def read_logs(logs: Path) -> dict[str, dict[str, float]]:
    """Per case (``fast-local@time``, ...) and step: the mean per request over every worker's
    sums but each worker's first (its warm-up and start)."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for path in sorted(logs.glob("round*-fast-*@*-error.log")):
        case = path.name.split("-", 1)[1].removesuffix("-error.log")
        seen_pids: set[str] = set()
        for line in path.read_text(errors="replace").splitlines():
            found = _LINE.search(line)
            if not found:
                continue
            pid = found.group(1)
            if pid not in seen_pids:
                seen_pids.add(pid)
                continue
            sums = totals[case]
            sums["n"] += int(found.group(3))
            for part in found.group(4).split():
                key, _, value = part.partition("=")
                sums[_KEY.get(key, key)] += float(value)
    return {
        case: {"requests": sums["n"], **{k: v / sums["n"] for k, v in sums.items() if k != "n"}}
        for case, sums in totals.items()
        if sums["n"]
    }


def table(per_case: dict[str, dict[str, float]]) -> str:
    cases = sorted(per_case)
    names = [*PHASES, *(n for _, n in STEPS), AFTER]
    unit = {c: "ns" if c.endswith("@time") else "B" for c in cases}
    rows = [
        f"| step | {' | '.join(f'{c} ({unit[c]}/req)' for c in cases)} |",
        "| --- |" + " ---: |" * len(cases),
    ]
    for name in names:
        if not any(name in per_case[c] for c in cases):
            continue
        cells = [f"{per_case[c].get(name, 0):,.0f}" for c in cases]
        label = f"**{name}** (phase)" if name in PHASES else name
        rows.append(f"| {label} | {' | '.join(cells)} |")
    counted = " | ".join(f"{per_case[c]['requests']:,.0f}" for c in cases)
    rows.append(f"| requests counted | {counted} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every case (default 3)")
    parser.add_argument("--seconds", type=int, default=5, help="measured wrk seconds per case (default 5)")
    parser.add_argument("--prefix", type=Path, default=None, help="APISIX prefix, as bench/apisix_gateway.py")
    add_output_options(parser)
    args = parser.parse_args(argv)
    out = Output(args.format, args.json_out)
    with tempfile.TemporaryDirectory(prefix="spillway-steps-") as tmp:
        work = Path(tmp)
        timed, counted = variant(work, "time", False), variant(work, "bytes", True)
        logs = work / "logs"
        run: list[str] = [
            *("--rounds", str(args.rounds), "--seconds", str(args.seconds), "--warmup-seconds", "2"),
            *("--budget-seconds", "0", "--cloud-cap", "1000000"),
            *("--cases", "split", "noop", "fast-local", "fast-cloud"),
            *("--lua-variant", f"time={timed}", "--lua-variant", f"bytes={counted}"),
            *("--keep-logs", str(logs)),
            *(("--format", "table") if out.table else ("--format", "json")),
        ]
        if args.prefix is not None:
            run += ["--prefix", str(args.prefix)]
        code = gw.main(run)
        if code:
            return code
        per_case = read_logs(logs)
    notes: dict[str, Any] = {
        **machine_note(),
        **gw.source_note(),
        "rounds": args.rounds,
        "seconds": args.seconds,
    }
    out.record({"kind": "steps", "per_case": per_case, "notes": notes})
    if out.table:
        print(table(per_case))
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
