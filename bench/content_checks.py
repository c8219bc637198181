"""What content checks cost: CPU per request with and without them, on both routes, through a real
Apache APISIX 3.18, for bodies of 1 KiB, 64 KiB and over ``content.max_scan_bytes``.

One APISIX (``devtools/apisix.py``, one nginx worker) carries four routes, told apart by the Host
header: the ext-plugin route (``apisix_route.route``: the runner decides, and reads the body over
ExtraInfo) and the fast path's (``fast_path.route.fast_route``: the ``spillway`` Lua plugin
decides, and reads the body in the access phase), each with ``content_checks`` and without. The
runner (``python -m gateway_plugin run``) scrapes an overloaded feed (500 ms queueing against a
200 ms target), so every public request is one that would leave, which is the only kind whose text
is read. The upstreams are one Debian nginx answering ``return 200`` (``bench/apisix_gateway.py``).

Each body is a KServe v2 JSON request with one BYTES tensor of sentences that no detector matches
(words, numbers, dates, versions, prices: what real text holds), so every detector reads all of it:

    1k     about 1 KiB
    64k    just under 64 KiB (the default max_scan_bytes)
    over   256 KiB: over the bound, so it is not read. content.unscannable is as_labelled here,
           so that it leaves with checks as without them and the ratio is the cost of the check
           alone (with the default, stay_home, it would stay on the overloaded cluster, where the
           runner sheds most such requests with 503: another path, not a cost)

All four built-ins are on, and three operator patterns: two with a literal every match holds
(``EMP-[0-9]{6}``, ``(?i)\bproject-[a-f0-9]{8}\b``, the docs' residency page's) and one without
(``\b[A-Z]{2}[0-9]{7}\b``), which the fast path's automaton reads byte by byte.

For each body, route kind and round, ``wrk -t1 -c<connections>`` posts it to the route with checks
and to the same route without them (the order alternating between rounds): CPU per request is
user+system time from /proc over the measured window (APISIX's master and worker, and the runner
with all its threads) divided by the requests wrk completed. Ratios are medians of per-round
ratios (with checks / without); "added" is the median per-round difference in µs. Every
measurement checks from the upstreams' logs that its requests went where they should.

Engines (``--engines``), each round starting APISIX once per engine (their order alternating):
``re2``, what ships (operators' patterns on RE2 in the runner, on the compiled program's DFA on the
fast path), and ``re``, what ran before (Python's ``re`` in the runner, through
``bench/content_engine_re.py``; PCRE in the plugin, through a ``spillway/dfa.lua`` written for the
run that calls ``ngx.re.find`` on each pattern). The last table is the switch's cost: CPU per
request with checks, ``re2`` over ``re``, per round.

    python bench/content_checks.py [--rounds 3] [--seconds 5] [--connections 8] [--engines re2,re]
                                   [--sizes 1k,64k,over] [--json-out F]

Needs APISIX in a prefix of its own (--prefix, else $SPILLWAY_APISIX_PREFIX, else
/opt/spillway-apisix-bench), ``wrk`` and ``nginx`` (both come with scripts/install-apisix.sh).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from apisix_gateway import (
    Upstreams,
    apisix_cpu,
    metrics_feed,
    run_wrk,
    upstream_nginx,
    wrk_command,
)
from content_engine_re import pattern_detector as pattern_detector_re
from harness import LOOPBACK, ROOT, cpu_seconds, free_port, machine_note, median, render_table, say

from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.content import checks as content
from gateway_plugin.content.checks import body_verdict, content_policy
from gateway_plugin.content.program import program
from gateway_plugin.fast_path.route import config_snippet, fast_route

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools import apisix

INFER_PATH = "/v2/models/add_sub/infer"
PLUGINS = ["spillway-edge", "spillway", "ext-plugin-pre-req", "traffic-split", "http-logger"]
SENTENCE = "On 2024-05-17 the build v3.12.1 ran 42 jobs in 7.5 minutes for 19.99 EUR, then rested. "
SIZES = {"1k": 1024, "64k": 65_000, "over": 256 * 1024}
ROUTES = ("ext-plugin", "fast path")
PATTERNS = {
    "employee_id": "EMP-[0-9]{6}",
    "project": "(?i)\\bproject-[a-f0-9]{8}\\b",
    "passport": "\\b[A-Z]{2}[0-9]{7}\\b",
}
ENGINES = ("re2", "re")


def body_of(size: int) -> bytes:
    """A KServe request of about ``size`` bytes: one BYTES tensor of 512-byte texts."""
    texts, total = [], 80
    while total < size:
        text = (SENTENCE * 6)[: min(512, size - total)]
        texts.append(text)
        total += len(text) + 4
    tensor = {"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)], "data": texts}
    return json.dumps({"inputs": [tensor]}).encode()


def config(ups: Upstreams, feed_url: str) -> dict[str, Any]:
    return {
        "local": {
            "endpoints": [{"url": f"http://{LOOPBACK}:{ups.local_port}", "metrics_url": feed_url}],
            "latency_target_ms": 200,
        },
        "targets": [
            {
                "name": "aws",
                "kind": "aws_lambda",
                "mode": "upstream",
                "url": f"http://{LOOPBACK}:{ups.aws_port}",
                "signing_key_env": None,
                "cold_start_ms": 0,
                "concurrency_cap": 1000,
            }
        ],
        "content": {"unscannable": "as_labelled", "patterns": PATTERNS},
        "metrics": {"listen": f"{LOOPBACK}:{free_port()}"},
        "outcomes": {"listen": f"{LOOPBACK}:{free_port()}"},
    }


def host(kind: str, checks: bool) -> str:
    return f"{'fast' if kind == 'fast path' else 'ext'}-{'checks' if checks else 'plain'}"


def routes(validated: SpillwayConfig, token: bytes) -> str:
    made = []
    for checks in (True, False):
        overrides = {"content_checks": True} if checks else None
        ext = route(validated, token, host("ext-plugin", checks), overrides=overrides)
        fast = fast_route(validated, token, host("fast path", checks), overrides=overrides)
        made += [
            {**ext, "hosts": [host("ext-plugin", checks)]},
            {**fast, "hosts": [host("fast path", checks)]},
        ]
    return yaml.safe_dump({"routes": made}, sort_keys=False) + "#END\n"


def _lua_string(data: bytes) -> str:
    return '"' + "".join(f"\\{b:03d}" for b in data) + '"'


def wrk_script(work: Path, name: str, body: bytes, host_header: str) -> Path:
    path = work / f"{name}.lua"
    headers = {"Host": host_header, "Content-Type": "application/json", "X-Data-Classification": "public"}
    lines = [f"wrk.method = {_lua_string(b'POST')}", f"wrk.body = {_lua_string(body)}"]
    lines += [
        f"wrk.headers[{_lua_string(k.encode())}] = {_lua_string(v.encode())}" for k, v in headers.items()
    ]
    lines.append(
        'done = function(s, l, r) io.write(string.format("WRKJSON {\\"requests\\":%d,\\"duration_us\\":%d,'
        '\\"non2xx\\":%d,\\"errors\\":%d}\\n", s.requests, s.duration, s.errors.status, '
        "s.errors.connect + s.errors.read + s.errors.write + s.errors.timeout)) end"
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_spilling(gateway: apisix.Apisix, timeout_s: float = 30.0) -> None:
    """Until every route sends a small public request to the cloud (the runner has scraped the
    overloaded feed, the fast path has its table)."""
    body = body_of(200)
    deadline = time.monotonic() + timeout_s
    pending = [host(kind, checks) for kind in ROUTES for checks in (True, False)]
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"routes {pending} not spilling within {timeout_s:.0f} s")
        conn = http.client.HTTPConnection(LOOPBACK, gateway.settings.port, timeout=5)
        try:
            headers = {"Host": pending[0], "X-Data-Classification": "public"}
            conn.request("POST", INFER_PATH, body=body, headers=headers)
            answer = conn.getresponse()
            answer.read()
            if answer.getheader("x-bench-upstream") == "aws":
                pending.pop(0)
        finally:
            conn.close()
        time.sleep(0.05)


def measure(gateway: apisix.Apisix, ups: Upstreams, script: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One wrk run; every request must go out (to "aws")."""
    want = "aws"
    url = f"http://{LOOPBACK}:{gateway.settings.port}{INFER_PATH}"
    run_wrk(wrk_command(url, args.connections, 1, script), 1)
    runner = gateway.runner_pids()[-1]
    offsets = ups.offsets()
    before = cpu_seconds(runner), apisix_cpu(gateway)
    got, _ = run_wrk(wrk_command(url, args.connections, args.seconds, script), args.seconds)
    after = cpu_seconds(runner), apisix_cpu(gateway)
    served = ups.served_since(offsets)
    n = int(got["requests"]) or 1
    went = {name: sum(counts.values()) for name, counts in served.items()}
    # The upstreams' logs also hold the tail of the warm-up that finished after the offsets.
    if got["non2xx"] or got["errors"] or went.get(want, 0) < 0.99 * sum(went.values()):
        raise RuntimeError(f"{script.name}: expected the requests at {want}; wrk {got}, upstreams {served}")
    return {
        "served": went,
        "requests": n,
        "req_per_s": n / (got["duration_us"] / 1e6),
        "runner_us": (after[0] - before[0]) / n * 1e6,
        "apisix_us": (after[1] - before[1]) / n * 1e6,
        "total_us": (after[0] - before[0] + after[1] - before[1]) / n * 1e6,
    }


def in_process(validated: SpillwayConfig, engines: list[str]) -> dict[str, dict[str, float]]:
    """The runner's reading and detectors alone (body_verdict), µs per body, for reference: each
    engine's, and with no operator pattern; interleaved, medians of 5 runs."""
    policies = {engine: content_policy(validated) for engine in engines if engine != "re"}
    if "re" in engines:
        with_re2 = content.pattern_detector
        content.pattern_detector = pattern_detector_re
        policies["re"] = content_policy(validated)
        content.pattern_detector = with_re2
    plain = validated.model_copy(update={"content": validated.content.model_copy(update={"patterns": {}})})
    policies["no patterns"] = content_policy(plain)
    timings: dict[str, dict[str, float]] = {name: {} for name in policies}
    for size_name, size in SIZES.items():
        body, n = body_of(size), 400 if size < 10_000 else 20
        runs: dict[str, list[float]] = {name: [] for name in policies}
        for _ in range(5):
            for name, policy in policies.items():
                started = time.perf_counter()
                for _ in range(n):
                    body_verdict(policy, body, None)
                runs[name].append((time.perf_counter() - started) / n * 1e6)
        for name, values in runs.items():
            timings[name][size_name] = median(values)
    return timings


def pcre_dfa_lua(work: Path) -> Path:
    """A ``spillway/dfa.lua`` that runs each operator pattern on PCRE, as the plugin did before
    (the table carries each pattern's program; this knows which pattern each program is). Returns
    the directory to put first on APISIX's Lua path."""
    top = work / "lua-pcre"
    folder = top / "apisix" / "plugins" / "spillway"
    folder.mkdir(parents=True, exist_ok=True)
    names = "\n".join(f"    [ [==[{program(p).encoded()}]==] ] = [==[{p}]==]," for p in PATTERNS.values())
    (folder / "dfa.lua").write_text(
        "-- bench only (bench/content_checks.py --engines re): operators' patterns on PCRE.\n"
        f"local PATTERNS = {{\n{names}\n}}\n"
        "local _M = {}\n"
        "function _M.compile(text) local p = PATTERNS[text]; return p and { pattern = p } or nil end\n"
        "function _M.search(prog, text)\n"
        '    local from, _, err = ngx.re.find(text, prog.pattern, "jo")\n'
        "    if err then return nil end\n"
        "    return from ~= nil\n"
        "end\n"
        "return _M\n"
    )
    return top


def gateway_for(engine: str, work: Path, validated: SpillwayConfig, token: str) -> apisix.Apisix:
    snippet = config_snippet(validated)
    spillway_lua = Path(snippet["apisix"]["extra_lua_path"]).parent
    runner = [sys.executable, "-m", "gateway_plugin"]
    lua_paths: dict[str, Any] = {"extra_lua_path": spillway_lua}
    if engine == "re":
        runner = [sys.executable, str(Path(__file__).with_name("content_engine_re.py"))]
        lua_paths = {"extra_lua_path": pcre_dfa_lua(work), "more_lua_paths": [spillway_lua]}
    return apisix.Apisix(
        apisix.ApisixSettings(
            port=free_port(),
            routes_yaml=routes(validated, token.encode()),
            runner_cmd=[*runner, "run", "--config", str(work / "spillway.yaml")],
            plugins=PLUGINS,
            envs=["SPILLWAY_ROUTE_TOKEN"],
            env={"SPILLWAY_ROUTE_TOKEN": token},
            shared_dicts=snippet["nginx_config"]["http"]["custom_lua_shared_dict"],
            plugin_attr=snippet["plugin_attr"],
            **lua_paths,
        )
    )


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    token = secrets.token_hex(32)
    samples: list[dict[str, Any]] = []
    with upstream_nginx(work) as ups, metrics_feed() as feed:
        feed.mode = "overloaded"
        settings = config(ups, feed.url)
        validated = SpillwayConfig.model_validate(settings)
        (work / "spillway.yaml").write_text(yaml.safe_dump(settings))
        for rnd in range(args.rounds):
            engines = args.engines if rnd % 2 == 0 else args.engines[::-1]
            for engine in engines:
                gateway = gateway_for(engine, work, validated, token)
                try:
                    gateway.start()
                    wait_spilling(gateway)
                    for size_name in args.sizes:
                        size = SIZES[size_name]
                        if size_name == "over" and engine != ENGINES[0]:
                            continue  # not read: no engine runs
                        body = body_of(size)
                        for kind in ROUTES:
                            order = (True, False) if rnd % 2 == 0 else (False, True)
                            for checks in order:
                                name = f"{size_name}-{host(kind, checks)}"
                                script = wrk_script(work, name, body, host(kind, checks))
                                say(f"round {rnd + 1}, {engine}: {name}")
                                got = measure(gateway, ups, script, args)
                                sample = {"round": rnd, "engine": engine, "body": size_name, "route": kind}
                                samples.append({**sample, "checks": checks, **got})
                finally:
                    gateway.stop()
    return {
        "samples": samples,
        "in_process_us": in_process(validated, args.engines),
        "machine": machine_note(),
    }


def _by_round(samples: list[dict[str, Any]]) -> dict[int, dict[bool, dict[str, Any]]]:
    by_round: dict[int, dict[bool, dict[str, Any]]] = {}
    for s in samples:
        by_round.setdefault(s["round"], {})[s["checks"]] = s
    return {r: pair for r, pair in by_round.items() if len(pair) == 2}


def summary(result: dict[str, Any], engine: str) -> list[list[object]]:
    rows = []
    samples = [s for s in result["samples"] if s.get("engine", ENGINES[0]) == engine]
    for size_name in SIZES:
        for kind in ROUTES:
            pairs = list(
                _by_round([s for s in samples if s["body"] == size_name and s["route"] == kind]).values()
            )
            if not pairs:
                continue
            ratio = median([r[True]["total_us"] / r[False]["total_us"] for r in pairs])
            added = median([r[True]["total_us"] - r[False]["total_us"] for r in pairs])
            rows.append(
                [
                    size_name,
                    kind,
                    round(median([r[False]["total_us"] for r in pairs])),
                    round(median([r[True]["total_us"] for r in pairs])),
                    f"{ratio:.2f}",
                    round(added),
                    f"{median([r[True]['req_per_s'] / r[False]['req_per_s'] for r in pairs]):.2f}",
                ]
            )
    return rows


def switch(result: dict[str, Any]) -> list[list[object]]:
    """CPU per request with checks, re2 over re, per round; and what the checks add with each."""
    rows = []
    samples = result["samples"]
    for size_name in ("1k", "64k"):
        for kind in ROUTES:
            mine = [s for s in samples if s["body"] == size_name and s["route"] == kind]
            new = _by_round([s for s in mine if s["engine"] == "re2"])
            old = _by_round([s for s in mine if s["engine"] == "re"])
            rounds = sorted(set(new) & set(old))
            if not rounds:
                continue
            rows.append(
                [
                    size_name,
                    kind,
                    round(median([old[r][True]["total_us"] for r in rounds])),
                    round(median([new[r][True]["total_us"] for r in rounds])),
                    f"{median([new[r][True]['total_us'] / old[r][True]['total_us'] for r in rounds]):.2f}",
                    round(median([old[r][True]["total_us"] - old[r][False]["total_us"] for r in rounds])),
                    round(median([new[r][True]["total_us"] - new[r][False]["total_us"] for r in rounds])),
                ]
            )
    return rows


HEADERS = [
    "body",
    "route",
    "cpu µs/req without",
    "cpu µs/req with checks",
    "ratio",
    "added µs",
    "throughput ratio",
]
SWITCH_HEADERS = [
    "body",
    "route",
    "cpu µs/req with checks, re",
    "with checks, re2",
    "re2 / re",
    "checks add, re",
    "checks add, re2",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--prefix", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument(
        "--engines",
        type=lambda v: v.split(","),
        default=list(ENGINES),
        help="re2 (what ships), re (operators' patterns on Python's re and PCRE, as before)",
    )
    parser.add_argument("--sizes", type=lambda v: v.split(","), default=list(SIZES), help="1k,64k,over")
    args = parser.parse_args(argv)
    if not set(args.engines) <= set(ENGINES) or not args.engines:
        parser.error(f"--engines: a comma-separated list of {', '.join(ENGINES)}")
    if not set(args.sizes) <= set(SIZES) or not args.sizes:
        parser.error(f"--sizes: a comma-separated list of {', '.join(SIZES)}")
    prefix = args.prefix or Path(os.environ.get("SPILLWAY_APISIX_PREFIX") or "/opt/spillway-apisix-bench")
    os.environ["SPILLWAY_APISIX_PREFIX"] = str(prefix)
    reason = apisix.missing_reason()
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="spillway-content-bench-") as tmp:
        result = run(args, Path(tmp))
    for engine in args.engines:
        print(f"engine {engine}:")
        print(render_table(HEADERS, summary(result, engine)))
    if set(args.engines) == set(ENGINES):
        print("the switch (re2 over re):")
        print(render_table(SWITCH_HEADERS, switch(result)))
    print("runner alone, reading and detectors per body (µs):", json.dumps(result["in_process_us"]))
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
