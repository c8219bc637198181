"""Spillway through a real Apache APISIX 3.18: requests/s, latency and runner CPU per request.

Every case is one APISIX (``devtools/apisix.py``: the testbed built by ``scripts/install-apisix.sh``,
standalone YAML, ``--workers`` nginx workers, 1 by default) with one route on ``/v2/*`` whose
``traffic-split`` carries Spillway's cloud rule (``X-Spillway-Target`` equal to the aws target's
MAC'd value) and whose default upstream is the "local" one:

    split            traffic-split only: no ext-plugin; the client never sends the header
    plain            the route's upstream alone: no plugin at all
    noop             the route's upstream and bench/lua's ``spillway-noop``: the fast path's three
                     phases at its priority, doing nothing (what any per-request Lua plugin costs)
    noop-body        the same plugin reading the body in its access phase and nothing else (what
                     any plugin that sees the whole request before it lets it on costs)
    trivial          ext-plugin-pre-req + third_party/apisix-testbed/runner/runner.py (asyncio,
                     the a6pluginprotos FlatBuffers classes; sets X-Spillway-Target: local)
    go-noop          ext-plugin-pre-req + apache/apisix-go-plugin-runner's ``say`` with conf {}
                     (a no-op; /work/shared/anchors), when the binary is there
    spillway-local   the route ``gateway_plugin.apisix_route.route`` makes (ext-plugin-pre-req,
                     traffic-split, http-logger posting outcomes to the runner) with
                     ``python -m gateway_plugin run`` as ext-plugin.cmd; the metrics feed is static
                     (no queueing), so every request is decided ``local;local_ok``
    spillway-cloud   the same route and runner with an overloaded feed (500 ms of queueing):
                     every public request spills to the "aws" upstream-mode target, signed over
                     UNSIGNED-PAYLOAD; its concurrency_cap is --cloud-cap (the example config's 50 by
                     default; wrk's connections are never more than that in flight)
    spillway-local-nologger   optional: spillway-local with ``outcomes.listen: null`` (no http-logger)
    fast-local       the fast path: the route ``gateway_plugin.fast_path.route.fast_route`` makes
                     (the ``spillway`` Lua plugin + traffic-split), the runner as ext-plugin.cmd
                     serving the decision table; calm feed, every request ``local;local_ok``
    fast-cloud       the same with the overloaded feed: every request spills to "aws", signed in Lua
    fast-content     fast-cloud on a route with content checks: each body read before it leaves
    fast-local-split, fast-cloud-split   optional: the same with a route made without the plugin's
                     ``upstreams``, where traffic-split picks the upstream from spillway_upstream

After the rounds, when a fast case ran, ``--budget-seconds`` of wrk go through the fast path with
an hourly budget on aws of ``--budget-requests`` cold requests: what aws answered and what the
runner's ledger holds, against the budget (the overshoot). The table's age at each fast-path
decision comes from the runner's ``spillway_fast_path_table_age_seconds`` histogram.

The local and aws upstreams are one Debian nginx of their own (own prefix, config and pid file,
one worker) answering ``return 200 '{"ok":true}'`` on two loopback ports; it logs each answer's
status, one file per upstream, so every measurement checks where its requests went. The load is
``wrk -t1 -cN`` (keep-alive, closed loop) POSTing the add_sub JSON inference with
``X-Data-Classification: public``.

Each round starts every case once, in an order rotated between rounds: APISIX start, probe until
the expected upstream (and decision) answers, ``--warmup-seconds`` of unmeasured wrk, then
``--seconds`` measured. CPU per request is user+system time from /proc over the measured window
divided by the requests wrk completed: the runner process (all its threads: the outcome endpoint,
the scraper, /metrics), APISIX (master and workers; this testbed has no privileged agent), the
upstream nginx, and wrk.
Figures are medians over rounds; ratios are medians of per-round ratios against the case measured
in the same round. On a shared 2-core machine the ratios are what to read. Each measurement also
reports what the upstreams answered (from their logs), the runner's decision counters (its
/metrics), wrk's non-2xx answers and errors, and APISIX's error.log lines of warn or worse (runner
stderr included) inside the measured window and outside it (``--keep-logs DIR`` keeps each file).

    python bench/apisix_gateway.py [--rounds 3] [--seconds 6] [--workers 1] [--cases ...]
        [--lua-variant NAME=DIR ...] [--json-out F] [--markdown-out F]

``--lua-variant NAME=DIR`` measures a change to the Lua plugins against the checkout's in the same
run: every fast case runs again as ``CASE@NAME`` with ``DIR`` (a copy of gateway_plugin/fast_path/lua,
changed) as APISIX's extra_lua_path, interleaved with the other cases in every round.

Needs APISIX in a prefix of its own: --prefix, else $SPILLWAY_APISIX_PREFIX, else
/opt/spillway-apisix-bench, never the tests' default /opt/spillway-apisix unless named (install with
``SPILLWAY_APISIX_PREFIX=/opt/spillway-apisix-bench bash scripts/install-apisix.sh``); ``wrk`` and
``nginx`` (both come with the installer); a6pluginprotos + flatbuffers for the trivial runner (dev
extra). It refuses a prefix whose APISIX is already running, and stops only what it started.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from harness import (
    LOOPBACK,
    ROOT,
    Output,
    add_output_options,
    cpu_seconds,
    descendants,
    free_port,
    launch,
    machine_note,
    median,
    render_table,
    running,
    say,
)

from gateway_plugin.apisix_route import route, standalone_yaml
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import config_snippet, fast_route
from gateway_plugin.policy.build import build_policy

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools import apisix
from devtools.legacy_fast_route import split_fast_route

TESTBED_RUNNER = ROOT / "third_party" / "apisix-testbed" / "runner" / "runner.py"
GO_RUNNER = Path("/work/shared/anchors/apisix-go-plugin-runner/go-runner")
INFER_PATH = "/v2/models/add_sub/infer"
# testing/function.py ADD_SUB_BODY: what the function's own tests send.
ADD_SUB_BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]},
        ]
    }
).encode()
REQUEST_HEADERS = {"Content-Type": "application/json", "X-Data-Classification": "public"}
UPSTREAM_HEADER = "x-bench-upstream"
DECISION_HEADER = "x-spillway-decision"
INSTANCE = "fn-bench-1"

# Not the tests' default prefix: tests and demos start and stop APISIX there.
DEFAULT_PREFIX = Path("/opt/spillway-apisix-bench")
BASELINE = "split"
SECOND_BASELINE = "trivial"
ALL_CASES = (
    "split",
    "plain",
    "noop",
    "noop-body",
    "trivial",
    "go-noop",
    "spillway-local",
    "spillway-cloud",
    "spillway-local-nologger",
    "fast-local",
    "fast-cloud",
    "fast-content",
    "fast-local-split",
    "fast-cloud-split",
)
DEFAULT_CASES = (
    "split",
    "trivial",
    "go-noop",
    "spillway-local",
    "spillway-cloud",
    "fast-local",
    "fast-cloud",
)
NOOP_PLUGIN = "spillway-noop"
BENCH_LUA = ROOT / "bench" / "lua"
FAST_PLUGINS = ("spillway", "traffic-split", "ext-plugin-pre-req", "http-logger", "proxy-rewrite")


# ---------------------------------------------------------------------------------------------
# The upstreams: one nginx of our own, two loopback servers.

_NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
pid %(dir)s/nginx.pid;
error_log %(dir)s/error.log notice;
events { worker_connections 4096; }
http {
    access_log off;
    log_format bench_status '$status';
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_temp_path %(dir)s/client_body;
    proxy_temp_path %(dir)s/proxy;
    fastcgi_temp_path %(dir)s/fastcgi;
    uwsgi_temp_path %(dir)s/uwsgi;
    scgi_temp_path %(dir)s/scgi;
    server {
        listen 127.0.0.1:%(local)d;
        access_log %(dir)s/local.log bench_status;
        location / {
            default_type application/json;
            add_header X-Bench-Upstream local always;
            return 200 '{"ok":true}';
        }
    }
    server {
        listen 127.0.0.1:%(aws)d;
        access_log %(dir)s/aws.log bench_status;
        location / {
            default_type application/json;
            add_header X-Bench-Upstream aws always;
            add_header X-Spillway-Instance %(instance)s always;
            return 200 '{"ok":true}';
        }
    }
}
"""


@dataclass
class Upstreams:
    """The upstream nginx: its master pid and where each server logs the status of each answer."""

    dir: Path
    local_port: int
    aws_port: int
    pid: int = 0

    def log(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def offsets(self) -> dict[str, int]:
        return {name: self.log(name).stat().st_size for name in ("local", "aws")}

    def served_since(self, offsets: dict[str, int]) -> dict[str, dict[str, int]]:
        """Answers per upstream since ``offsets``, by status."""
        served: dict[str, dict[str, int]] = {}
        for name, offset in offsets.items():
            with self.log(name).open("rb") as f:
                f.seek(offset)
                statuses = f.read().decode(errors="replace").split()
            counts: dict[str, int] = {}
            for status in statuses:
                counts[status] = counts.get(status, 0) + 1
            served[name] = counts
        return served

    def cpu(self) -> float:
        return cpu_seconds(self.pid) + sum(cpu_seconds(p) for p in descendants(self.pid))


@contextlib.contextmanager
def upstream_nginx(work: Path) -> Iterator[Upstreams]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    ups = Upstreams(work / "upstreams", free_port(), free_port())
    ups.dir.mkdir()
    conf = ups.dir / "nginx.conf"
    conf.write_text(
        _NGINX_CONF % {"dir": ups.dir, "local": ups.local_port, "aws": ups.aws_port, "instance": INSTANCE}
    )
    args = [nginx, "-p", str(ups.dir), "-c", str(conf), "-e", str(ups.dir / "error.log")]
    with running([]) as launched:
        launched.append(launch(args, dict(os.environ), ups.dir / "stdout.log"))
        ups.pid = launched[0].proc.pid
        deadline = time.monotonic() + 10
        while not all(_answers(port) for port in (ups.local_port, ups.aws_port)):
            if launched[0].exited() or time.monotonic() > deadline:
                raise RuntimeError(f"upstream nginx did not start: {launched[0].log_text()[-2000:]}")
            time.sleep(0.05)
        yield ups


def _answers(port: int) -> bool:
    try:
        return probe(port)[0] == 200
    except OSError:
        return False


def probe(port: int) -> tuple[int, dict[str, str], bytes]:
    """One request as wrk sends it, on a fresh connection: status, headers (lower-case), body."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
    try:
        conn.request("POST", INFER_PATH, body=ADD_SUB_BODY, headers=REQUEST_HEADERS)
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Triton's metrics as the runner scrapes them: calm (static) or overloaded (queueing).


@dataclass
class Feed:
    """``calm``: counters that never move and nothing pending, so the runner sees no queueing and no
    service time (its estimate is then the answer time http-logger reports, about a millisecond).
    ``overloaded``: every scrape adds 10 requests that queued 500 ms and computed 10 ms, 50 pending:
    an estimated 510 ms against the 200 ms target (spill), under the 800 ms saturation line, and
    still 260 ms when the scrape is 250 ms old (the backlog drains one compute time per request
    meanwhile; with 20 pending the estimate fell under the target between scrapes, and a third of
    the decisions went local)."""

    mode: str = "calm"
    url: str = ""
    scrapes: int = 0
    _success: float = 1000.0
    _queue_us: float = 0.0
    _compute_us: float = 1_000_000.0

    def text(self) -> str:
        self.scrapes += 1
        pending = 0
        if self.mode == "overloaded":
            self._success += 10
            self._queue_us += 10 * 500_000
            self._compute_us += 10 * 10_000
            pending = 50
        labels = '{model="add_sub",version="1"}'
        return (
            f"nv_inference_request_success{labels} {self._success}\n"
            f"nv_inference_queue_duration_us{labels} {self._queue_us}\n"
            f"nv_inference_compute_infer_duration_us{labels} {self._compute_us}\n"
            f"nv_inference_pending_request_count{labels} {pending}\n"
        )


@contextlib.contextmanager
def metrics_feed() -> Iterator[Feed]:
    feed = Feed()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                body = feed.text().encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    server.daemon_threads = True
    feed.url = f"http://{LOOPBACK}:{server.server_address[1]}/metrics"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield feed
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------------
# The cases: one APISIX each.


@dataclass(frozen=True)
class Case:
    name: str
    runner_cmd: list[str] | None
    routes_yaml: str
    upstream: str  # where every request must go
    decision: str | None = None  # prefix of X-Spillway-Decision every request must carry
    feed_mode: str = "calm"
    metrics_url: str | None = None  # the runner's /metrics (decision counters)
    logger: bool = False  # the route posts outcomes to the runner
    lua: dict[str, Any] | None = None  # config_snippet: the Lua plugins' path, dict, attrs
    lua_dir: Path | None = None  # --lua-variant: this directory's Lua plugins instead of the checkout's


@dataclass
class Setup:
    work: Path
    token: str
    signing_key: str
    upstreams: Upstreams
    feed: Feed
    go_runner: Path
    cloud_cap: int
    variants: dict[str, Path] = field(default_factory=dict)


def spillway_config(setup: Setup, metrics_port: int, outcomes_port: int | None) -> dict[str, Any]:
    ups = setup.upstreams
    return {
        "local": {
            "endpoints": [{"url": f"http://{LOOPBACK}:{ups.local_port}", "metrics_url": setup.feed.url}],
            "latency_target_ms": 200,
        },
        "targets": [
            {
                "name": "aws",
                "kind": "aws_lambda",
                "mode": "upstream",
                "url": f"http://{LOOPBACK}:{ups.aws_port}",
                "signing_key_env": "SPILLWAY_SIGNING_KEY",
                "sign_body": False,
                # Cold is allowed from the first request; the instance header makes it warm after
                # the first outcomes.
                "cold_start_ms": 0,
                "concurrency_cap": setup.cloud_cap,
            }
        ],
        "metrics": {"listen": f"{LOOPBACK}:{metrics_port}"},
        "outcomes": {"listen": None if outcomes_port is None else f"{LOOPBACK}:{outcomes_port}"},
    }


def make_case(name: str, setup: Setup) -> Case:
    # The route Spillway makes is the template: every case has its traffic-split rule and upstream.
    metrics_port = free_port()
    outcomes_port = None if name == "spillway-local-nologger" else free_port()
    config = spillway_config(setup, metrics_port, outcomes_port)
    made = route(SpillwayConfig.model_validate(config), setup.token.encode())
    base, _, variant = name.partition("@")
    if base.startswith("fast-"):
        case = fast_case(base, setup, config, metrics_port)
        if variant:
            # A variant may stop before the decision header: only where its requests went is checked.
            case = replace(case, name=name, lua_dir=setup.variants[variant], decision=None)
        return case
    if name.startswith("spillway-"):
        config_path = setup.work / f"{name}.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        cloud = name == "spillway-cloud"
        return Case(
            name,
            [sys.executable, "-m", "gateway_plugin", "run", "--config", str(config_path)],
            standalone_yaml(made),
            "aws" if cloud else "local",
            "aws;" if cloud else "local;local_ok",
            "overloaded" if cloud else "calm",
            f"http://{LOOPBACK}:{metrics_port}/metrics",
            "http-logger" in made["plugins"],
            lua=None if outcomes_port is None else config_snippet(SpillwayConfig.model_validate(config)),
        )
    plugins: dict[str, Any] = {"traffic-split": made["plugins"]["traffic-split"]}
    if name in ("plain", "noop", "noop-body"):
        plugins = {NOOP_PLUGIN: {"read_body": name == "noop-body"}} if name != "plain" else {}
    runner_cmd: list[str] | None = None
    if name == "trivial":
        runner_cmd, plugin = [sys.executable, str(TESTBED_RUNNER)], "trivial"
    elif name == "go-noop":
        runner_cmd, plugin = [str(setup.go_runner), "run", "-m", "prod"], "say"
    if runner_cmd is not None:
        ext = {"conf": [{"name": plugin, "value": "{}"}], "allow_degradation": False}
        plugins = {"ext-plugin-pre-req": ext, **plugins}
    plain = {
        "id": made["id"],
        "uri": made["uri"],
        "name": name,
        "plugins": plugins,
        "upstream": made["upstream"],
    }
    return Case(name, runner_cmd, yaml.safe_dump({"routes": [plain]}, sort_keys=False) + "#END\n", "local")


def fast_case(name: str, setup: Setup, config: dict[str, Any], metrics_port: int) -> Case:
    config_path = setup.work / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    validated = SpillwayConfig.model_validate(config)
    cloud = name.startswith(("fast-cloud", "fast-content"))
    if name.endswith("-split"):
        made = split_fast_route(validated, setup.token.encode())
    else:
        checks = {"content_checks": True} if name == "fast-content" else None
        made = fast_route(validated, setup.token.encode(), overrides=checks)
    return Case(
        name,
        [sys.executable, "-m", "gateway_plugin", "run", "--config", str(config_path)],
        standalone_yaml(made),
        "aws" if cloud else "local",
        "aws;" if cloud else "local;local_ok",
        "overloaded" if cloud else "calm",
        f"http://{LOOPBACK}:{metrics_port}/metrics",
        lua=config_snippet(validated),
    )


def apisix_settings(case: Case, setup: Setup, workers: int, port: int) -> apisix.ApisixSettings:
    extra: dict[str, Any] = {}
    if case.lua is not None:
        snippet = case.lua
        extra = {
            "extra_lua_path": case.lua_dir or Path(snippet["apisix"]["extra_lua_path"]).parent,
            "shared_dicts": snippet["nginx_config"]["http"]["custom_lua_shared_dict"],
            "plugin_attr": snippet["plugin_attr"],
        }
    if case.name.startswith("fast-"):
        extra["plugins"] = FAST_PLUGINS
    elif case.name in ("noop", "noop-body"):
        extra |= {"plugins": (*FAST_PLUGINS, NOOP_PLUGIN), "more_lua_paths": [BENCH_LUA]}
    return apisix.ApisixSettings(
        port=port,
        routes_yaml=case.routes_yaml,
        runner_cmd=case.runner_cmd,
        envs=["SPILLWAY_ROUTE_TOKEN", "SPILLWAY_SIGNING_KEY"],
        env={"SPILLWAY_ROUTE_TOKEN": setup.token, "SPILLWAY_SIGNING_KEY": setup.signing_key},
        workers=workers,
        **extra,
    )


# ---------------------------------------------------------------------------------------------
# wrk.

_WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = %(body)s
%(headers)s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\\"requests\\":%%d,\\"duration_us\\":%%d,\\"socket_errors\\":%%d,\\"non2xx\\":%%d," ..
    "\\"timeouts\\":%%d,\\"p50_us\\":%%d,\\"p90_us\\":%%d,\\"p99_us\\":%%d,\\"max_us\\":%%d," ..
    "\\"mean_us\\":%%f}\\n",
    summary.requests, summary.duration, e.connect + e.read + e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
"""


def _lua_string(data: bytes) -> str:
    return '"' + "".join(f"\\{b:03d}" for b in data) + '"'


def wrk_script(work: Path) -> Path:
    path = work / "request.lua"
    headers = "\n".join(
        f"wrk.headers[{_lua_string(k.encode())}] = {_lua_string(v.encode())}"
        for k, v in REQUEST_HEADERS.items()
    )
    path.write_text(_WRK_SCRIPT % {"body": _lua_string(ADD_SUB_BODY), "headers": headers})
    return path


def wrk_command(url: str, connections: int, seconds: int, script: Path) -> list[str]:
    return ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", "-s", str(script), url]


def run_wrk(cmd: list[str], seconds: int) -> tuple[dict[str, float], float]:
    """wrk's figures and its own CPU seconds (user + system, from wait4)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + seconds + 60
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"wrk ran past {seconds + 60} s")
            time.sleep(0.02)
        out.seek(0)
        text = out.read().decode(errors="replace")
    for line in text.splitlines():
        if line.startswith("WRKJSON "):
            got: dict[str, float] = json.loads(line.removeprefix("WRKJSON "))
            return got, usage.ru_utime + usage.ru_stime
    raise RuntimeError(f"wrk gave no result (exit {proc.returncode}): {text[-800:]}")


# ---------------------------------------------------------------------------------------------
# One measurement.


_LOG_LINE = re.compile(r"^\S+ \S+ \[(warn|error|crit|alert|emerg)\] \d+#\d+: (?:\*\d+ )?(.*)$")
# What a runner writes to its stderr lands in the same file (Python logging; a traceback).
_RUNNER_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (WARNING|ERROR|CRITICAL) (.*)$")
_TAIL = re.compile(r", (client|server|request|upstream|host): .*$")
_RUNNER_EXIT = re.compile(r"unknown process (\d+) exited with code (\d+)")


def log_findings(text: str) -> tuple[dict[str, int], list[str]]:
    """Counts of warn-and-worse lines in an nginx error log (with what runners wrote to it), and
    their distinct messages, most frequent first."""
    counts: dict[str, int] = {}
    distinct: dict[str, int] = {}
    for line in text.splitlines():
        found = _LOG_LINE.match(line) or _RUNNER_LINE.match(line)
        if found is None and line.startswith("Traceback"):
            found = re.match(r"(Traceback)(.*)", line)
        if found is None:
            continue
        level, message = found.groups()
        level = level.lower()
        counts[level] = counts.get(level, 0) + 1
        key = f"[{level}] " + _TAIL.sub("", message)[:240]
        distinct[key] = distinct.get(key, 0) + 1
    return counts, [f"{n}x {m}" for m, n in sorted(distinct.items(), key=lambda kv: -kv[1])]


_DECISION = re.compile(r"^spillway_decisions_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_GAUGE = re.compile(
    r"^(spillway_(?:warm_instances|target_in_flight|signals_fresh|overflowing|breaker_open"
    r"|fast_path_table_age_seconds_bucket|fast_path_table_age_seconds_count|fast_path_fail_safe_total"
    r"|cloud_spend_usd_total)(?:\{[^}]*\})?)"
    r" (\S+)$",
    re.M,
)
_AGE_BUCKET = re.compile(r'^spillway_fast_path_table_age_seconds_bucket\{le="([^"]+)"\}$')


def table_age(gauges: dict[str, float]) -> dict[str, float]:
    """From the runner's histogram: decisions counted, the share made from a table at most 100 ms
    old, and the bucket bounds holding 99 % and all of them (seconds)."""
    buckets = sorted(
        (float(m.group(1)), v) for k, v in gauges.items() if (m := _AGE_BUCKET.match(k)) is not None
    )
    total = gauges.get("spillway_fast_path_table_age_seconds_count", 0.0)
    if not total:
        return {}
    within = next((v for le, v in buckets if le == 0.1), 0.0)
    p99 = next((le for le, v in buckets if v >= 0.99 * total), float("inf"))
    top = next((le for le, v in buckets if v >= total), float("inf"))
    return {"decisions": total, "within_100ms": within / total, "p99_le_s": p99, "max_le_s": top}


def runner_metrics(metrics_url: str | None) -> tuple[dict[str, float], dict[str, float]]:
    """The runner's decision counters (``target;reason``) and a few gauges, from its /metrics."""
    if metrics_url is None:
        return {}, {}
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as answer:
            text = answer.read().decode()
    except (OSError, http.client.HTTPException) as exc:
        say(f"warning: cannot read the runner's /metrics: {exc}")
        return {}, {}
    found: dict[str, float] = {}
    for m in _DECISION.finditer(text):
        labels = dict(_LABEL.findall(m.group("labels")))
        found[f"{labels.get('target')};{labels.get('reason')}"] = float(m.group("value"))
    return found, {name: float(value) for name, value in _GAUGE.findall(text)}


def apisix_cpu(gateway: apisix.Apisix) -> float:
    """The master and its children (the workers); the runner is a worker's child, not counted."""
    if gateway.master_pid is None:
        return 0.0
    return cpu_seconds(gateway.master_pid) + sum(cpu_seconds(p) for p in gateway.worker_pids())


@dataclass
class Sample:
    kind: str
    round: int
    position: int
    case: str
    requests: int
    req_per_s: float
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    socket_errors: int
    non2xx: int
    timeouts: int
    runner_cpu_us_per_req: float
    apisix_cpu_us_per_req: float
    upstream_cpu_us_per_req: float
    wrk_cpu_us_per_req: float
    served: dict[str, dict[str, int]]
    decisions: dict[str, int]
    http_logger: bool
    probe_decision: str | None
    runner_gauges: dict[str, float]
    runner_pid: int | None
    runner_respawns: int
    runner_cores: float
    apisix_cores: float
    error_log_start: dict[str, int]
    error_log_load: dict[str, int]
    error_log_stop: dict[str, int]
    error_log_messages: dict[str, list[str]] = field(default_factory=dict)
    runner_exit_codes: list[int] = field(default_factory=list)
    loadavg_1m: float = 0.0
    start_s: float = 0.0


def wait_for_expected(gateway: apisix.Apisix, case: Case, port: int, timeout_s: float = 30.0) -> str | None:
    """Probe until the case's upstream (and decision) answer; the decision seen last."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status, headers, body = probe(port)
        except (OSError, http.client.HTTPException) as exc:
            last = repr(exc)
        else:
            decision = headers.get(DECISION_HEADER)
            ok = status == 200 and headers.get(UPSTREAM_HEADER) == case.upstream and body == b'{"ok":true}'
            if ok and (case.decision is None or (decision or "").startswith(case.decision)):
                return decision
            last = f"{status} upstream={headers.get(UPSTREAM_HEADER)} decision={decision} body={body[:200]!r}"
        time.sleep(0.1)
    raise RuntimeError(
        f"{case.name}: not answering as expected within {timeout_s:.0f} s: {last}\n"
        + gateway.error_log()[-2000:]
    )


def measure(
    case: Case, setup: Setup, args: argparse.Namespace, script: Path, rnd: int, position: int
) -> Sample:
    setup.feed.mode = case.feed_mode
    port = free_port()
    settings = apisix_settings(case, setup, args.workers, port)
    url = f"http://{LOOPBACK}:{port}{INFER_PATH}"
    began = time.monotonic()
    gateway = apisix.Apisix(settings)
    error_log = gateway.logs / "error.log"
    runner_pids: list[int] = []
    try:
        gateway.start()
        start_s = time.monotonic() - began
        probe_decision = wait_for_expected(gateway, case, port)
        run_wrk(wrk_command(url, args.connections, args.warmup_seconds, script), args.warmup_seconds)
        runner_pids = gateway.runner_pids()
        runner = runner_pids[-1] if runner_pids else None
        if case.runner_cmd is not None and runner is None:
            raise RuntimeError(f"{case.name}: APISIX logged no runner pid")
        before_decisions, _ = runner_metrics(case.metrics_url)
        offsets = setup.upstreams.offsets()
        started_at = error_log.stat().st_size  # start, probe and warm-up before; the window after
        window = time.monotonic()
        cpu0 = (cpu_seconds(runner) if runner else 0.0, apisix_cpu(gateway), setup.upstreams.cpu())
        got, wrk_cpu = run_wrk(wrk_command(url, args.connections, args.seconds, script), args.seconds)
        cpu1 = (cpu_seconds(runner) if runner else 0.0, apisix_cpu(gateway), setup.upstreams.cpu())
        window = time.monotonic() - window
        after_decisions, gauges = runner_metrics(case.metrics_url)
        served = setup.upstreams.served_since(offsets)
        loaded_at = error_log.stat().st_size
        runner_pids = gateway.runner_pids()
        if runner is not None and not apisix.alive(runner):
            say(f"warning: {case.name}: runner {runner} was gone after the measurement")
    finally:
        all_runners = gateway.runner_pids() if gateway.master_pid is not None else runner_pids
        leftover = gateway.stop()
        if leftover:
            say(f"warning: {case.name}: runner(s) {leftover} outlived APISIX; stopped")
    raw = error_log.read_bytes()
    if args.keep_logs is not None:
        args.keep_logs.mkdir(parents=True, exist_ok=True)
        (args.keep_logs / f"round{rnd + 1}-{case.name}-error.log").write_bytes(raw)
    segments = [raw[:started_at], raw[started_at:loaded_at], raw[loaded_at:]]
    findings = [log_findings(part.decode(errors="replace")) for part in segments]
    exits = [
        int(code)
        for pid, code in _RUNNER_EXIT.findall(raw.decode(errors="replace"))
        if int(pid) in all_runners
    ]
    n = int(got["requests"]) or 1
    used = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    delta = {k: round(v - before_decisions.get(k, 0.0)) for k, v in after_decisions.items()}
    has_runner = case.runner_cmd is not None
    return Sample(
        kind="sample",
        round=rnd,
        position=position,
        case=case.name,
        requests=int(got["requests"]),
        req_per_s=got["requests"] / (got["duration_us"] / 1e6),
        p50_us=got["p50_us"],
        p90_us=got["p90_us"],
        p99_us=got["p99_us"],
        max_us=got["max_us"],
        socket_errors=int(got["socket_errors"]),
        non2xx=int(got["non2xx"]),
        timeouts=int(got["timeouts"]),
        runner_cpu_us_per_req=used[0] / n * 1e6 if has_runner else float("nan"),
        apisix_cpu_us_per_req=used[1] / n * 1e6,
        upstream_cpu_us_per_req=used[2] / n * 1e6,
        wrk_cpu_us_per_req=wrk_cpu / n * 1e6,
        served=served,
        decisions={k: v for k, v in delta.items() if v},
        http_logger=case.logger,
        probe_decision=probe_decision,
        runner_gauges=gauges,
        runner_pid=runner_pids[-1] if runner_pids else None,
        runner_respawns=max(0, len(all_runners) - 1),
        runner_cores=used[0] / window if has_runner else float("nan"),
        apisix_cores=used[1] / window,
        error_log_start=findings[0][0],
        error_log_load=findings[1][0],
        error_log_stop=findings[2][0],
        error_log_messages={
            part: found[1][:8] for part, found in zip(("start", "load", "stop"), findings, strict=True)
        },
        runner_exit_codes=exits,
        loadavg_1m=round(os.getloadavg()[0], 2),
        start_s=start_s,
    )


def budget_check(setup: Setup, args: argparse.Namespace, script: Path) -> dict[str, Any]:
    """The fast path under wrk with an hourly budget on aws worth ``--budget-requests`` cold
    requests: what aws answered and what the runner's ledger holds against the budget."""
    metrics_port = free_port()
    config = spillway_config(setup, metrics_port, free_port())
    costs = build_policy(SpillwayConfig.model_validate(config)).targets["aws"]
    budget = costs.cold_cost_usd * args.budget_requests
    config["budgets"] = {"per_target_hourly_usd": {"aws": budget}}
    case = fast_case("fast-cloud", setup, config, metrics_port)
    setup.feed.mode = case.feed_mode
    port = free_port()
    gateway = apisix.Apisix(apisix_settings(case, setup, args.workers, port))
    offsets = setup.upstreams.offsets()
    try:
        gateway.start()
        wait_for_expected(gateway, case, port)
        url = f"http://{LOOPBACK}:{port}{INFER_PATH}"
        got, _ = run_wrk(wrk_command(url, args.connections, args.budget_seconds, script), args.budget_seconds)
        time.sleep(1.0)  # the next table fetches report the last of the spend
        decisions, gauges = runner_metrics(case.metrics_url)
    finally:
        gateway.stop()
    served = setup.upstreams.served_since(offsets)
    ledger = gauges.get('spillway_cloud_spend_usd_total{target="aws"}', 0.0)
    return {
        "kind": "budget",
        "requests": int(got["requests"]),
        "budget_usd": budget,
        "cold_cost_usd": costs.cold_cost_usd,
        "warm_cost_usd": costs.cost_usd,
        "aws_answers": sum(served.get("aws", {}).values()),
        "local_answers": sum(served.get("local", {}).values()),
        "ledger_usd": ledger,
        "overshoot_usd": ledger - budget,
        "overshoot_cold_requests": (ledger - budget) / costs.cold_cost_usd,
        "decisions": decisions,
    }


def budget_markdown(check: dict[str, Any]) -> list[str]:
    return [
        "",
        f"Budget under load (`wrk -c{{c}}` for the budget run, fast path, aws budget "
        f"{check['budget_usd']:.6g} USD = {check['budget_usd'] / check['cold_cost_usd']:,.0f} cold requests "
        f"of {check['cold_cost_usd']:.3g} USD; warm ones cost {check['warm_cost_usd']:.3g}): "
        f"{check['requests']:,} requests; aws answered {check['aws_answers']:,}, local "
        f"{check['local_answers']:,}; the runner's ledger holds {check['ledger_usd']:.6g} USD, "
        f"overshoot {check['overshoot_usd']:.3g} USD ({check['overshoot_cold_requests']:.3g} cold requests).",
    ]


# ---------------------------------------------------------------------------------------------
# Summary and output.


def jsonable(value: Any) -> Any:
    """NaN (no runner, no baseline) as null: JSON has no NaN."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value


def rotated(items: Sequence[str], by: int) -> list[str]:
    by %= len(items)
    return [*items[by:], *items[:by]]


def _ratios(mine: list[Sample], base: dict[int, Sample], value: Callable[[Sample], float]) -> float:
    return median([value(s) / value(base[s.round]) for s in mine if s.round in base and value(base[s.round])])


def _total(samples: list[Sample], key: Callable[[Sample], dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for s in samples:
        for k, v in key(s).items():
            total[k] = total.get(k, 0) + v
    return total


def summarise(samples: list[Sample], cases: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    split = {s.round: s for s in samples if s.case == BASELINE}
    trivial = {s.round: s for s in samples if s.case == SECOND_BASELINE}
    noop = {s.round: s for s in samples if s.case == "noop"}
    go = {s.round: s for s in samples if s.case == "go-noop"}
    for name in cases:
        mine = [s for s in samples if s.case == name]
        if not mine:
            continue
        cpu = [
            s.runner_cpu_us_per_req if s.runner_cpu_us_per_req == s.runner_cpu_us_per_req else 0.0
            for s in mine
        ]
        rows.append(
            {
                "kind": "summary",
                "case": name,
                "rounds": len(mine),
                "req_per_s": median([s.req_per_s for s in mine]),
                "of_split": _ratios(mine, split, lambda s: s.req_per_s),
                "of_trivial": _ratios(mine, trivial, lambda s: s.req_per_s),
                "p50_us": median([s.p50_us for s in mine]),
                "p99_us": median([s.p99_us for s in mine]),
                "p50_of_split": _ratios(mine, split, lambda s: s.p50_us),
                "p99_of_split": _ratios(mine, split, lambda s: s.p99_us),
                "p99_minus_split_us": median(
                    [s.p99_us - split[s.round].p99_us for s in mine if s.round in split]
                ),
                "table_age": [table_age(s.runner_gauges) for s in mine if table_age(s.runner_gauges)],
                "runner_cpu_us_per_req": median([s.runner_cpu_us_per_req for s in mine]),
                "runner_cpu_of_trivial": _ratios(mine, trivial, lambda s: s.runner_cpu_us_per_req),
                "of_noop": _ratios(mine, noop, lambda s: s.req_per_s),
                "p99_minus_noop_us": median(
                    [s.p99_us - noop[s.round].p99_us for s in mine if s.round in noop]
                ),
                "apisix_cpu_minus_noop_us": median(
                    [
                        s.apisix_cpu_us_per_req - noop[s.round].apisix_cpu_us_per_req
                        for s in mine
                        if s.round in noop
                    ]
                ),
                "of_go": _ratios(mine, go, lambda s: s.req_per_s),
                "runner_cpu_of_go": _ratios(mine, go, lambda s: s.runner_cpu_us_per_req),
                "apisix_cpu_us_per_req": median([s.apisix_cpu_us_per_req for s in mine]),
                "upstream_cpu_us_per_req": median([s.upstream_cpu_us_per_req for s in mine]),
                "wrk_cpu_us_per_req": median([s.wrk_cpu_us_per_req for s in mine]),
                "total_cpu_us_per_req": median(
                    [
                        c + s.apisix_cpu_us_per_req + s.upstream_cpu_us_per_req + s.wrk_cpu_us_per_req
                        for c, s in zip(cpu, mine, strict=True)
                    ]
                ),
                "runner_cores": median([s.runner_cores for s in mine]),
                "apisix_cores": median([s.apisix_cores for s in mine]),
                "requests": sum(s.requests for s in mine),
                "errors": sum(s.socket_errors + s.non2xx + s.timeouts for s in mine),
                "served": {k: v for k, v in _total(mine, lambda s: _by_upstream(s.served)).items() if v},
                "served_non_200": sum(
                    n
                    for s in mine
                    for statuses in s.served.values()
                    for st, n in statuses.items()
                    if st != "200"
                ),
                "decisions": _total(mine, lambda s: s.decisions),
                "error_log_load": _total(mine, lambda s: s.error_log_load),
                "error_log_load_messages": sorted(
                    {m for s in mine for m in s.error_log_messages.get("load", [])}
                ),
                "runner_respawns": sum(s.runner_respawns for s in mine),
                "runner_exit_codes": sorted({c for s in mine for c in s.runner_exit_codes}),
                "loadavg_1m": [s.loadavg_1m for s in mine],
            }
        )
    return rows


def _by_upstream(served: dict[str, dict[str, int]]) -> dict[str, int]:
    return {name: sum(statuses.values()) for name, statuses in served.items()}


def versions(go_runner: Path | None) -> dict[str, str]:
    from importlib import metadata

    def first_line(cmd: list[str]) -> str:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        except OSError:
            return "not found"
        return (
            (done.stdout + done.stderr).strip().splitlines()[0]
            if (done.stdout + done.stderr).strip()
            else "?"
        )

    found = {
        "apisix": "3.18.0 (third_party/apisix-testbed)",
        "nginx": first_line(["nginx", "-v"]).removeprefix("nginx version: nginx/") + " (Debian)",
        "luajit": " ".join(first_line(["luajit", "-v"]).split()[1:2]),
        "wrk": first_line(["wrk", "--version"]).split(" [")[0].removeprefix("wrk "),
    }
    for name in ("uvloop", "a6pluginprotos", "flatbuffers"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    if go_runner is not None:
        sources = go_runner.parent / "SOURCES.txt"
        head = sources.read_text().split()[:3] if sources.exists() else []
        found["apisix-go-plugin-runner"] = head[2][:12] if len(head) > 2 else "?"
    return found


def source_note() -> dict[str, Any]:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout

    status = git("status", "--porcelain").splitlines()
    changed = [line[3:] for line in status if line and not line.startswith("??")]
    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "uncommitted": [
            f
            for f in changed
            if f.startswith(("gateway_plugin/", "functions/", "third_party/", "devtools/apisix.py"))
        ],
    }


def _fmt(value: object, digits: int = 0) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "-" if value != value else f"{value:,.{digits}f}"
    return str(value)


DESCRIPTIONS = {
    "fast-local": "fast path (Lua), decides local",
    "fast-cloud": "fast path (Lua), decides cloud (signed)",
    "fast-local-split": "fast path, local, traffic-split picks the upstream",
    "fast-cloud-split": "fast path, cloud, traffic-split picks the upstream",
    "split": "traffic-split only",
    "plain": "the upstream alone, no plugin",
    "noop": "no-op Lua plugin (three phases)",
    "noop-body": "no-op Lua plugin reading the body",
    "fast-content": "fast path (Lua), decides cloud, content checks",
    "trivial": "trivial Python runner (testbed)",
    "go-noop": "Go runner, no-op `say`",
    "spillway-local": "Spillway, decides local",
    "spillway-cloud": "Spillway, decides cloud (signed)",
    "spillway-local-nologger": "Spillway, local, no http-logger",
}


def describe(case: str) -> str:
    """A case's row label; a --lua-variant's runs say which Lua they ran."""
    base, _, variant = case.partition("@")
    label = DESCRIPTIONS.get(base, base)
    return f"{label}, Lua `{variant}`" if variant else label


def _startup_messages(samples: list[Sample]) -> list[str]:
    """Distinct warn-or-worse lines of APISIX starting and stopping, without counts and pids."""
    seen: dict[str, None] = {}
    for s in samples:
        for part in ("start", "stop"):
            for message in s.error_log_messages.get(part, []):
                text = re.sub(r"^\d+x ", "", message)
                text = re.sub(r"pid \d+", "pid N", text)
                text = re.sub(r"\{[^}]*\}", "{...}", text)
                seen.setdefault(text[:160], None)
    return list(seen)


def markdown(
    rows: list[dict[str, Any]], samples: list[Sample], notes: list[dict[str, Any]], command: str
) -> str:
    start, end = notes[0], notes[-1]
    packages = ", ".join(f"{k} {v}" for k, v in start["versions"].items())
    lines = [
        "```",
        command,
        "```",
        "",
        f"Run on {start['date']} ({end['wall_s']:.0f} s; Python {start['python']}, {start['cpus']} CPUs; "
        f"load average {start['loadavg_1m']} at the start, {end['loadavg_1m']} at the end; commit "
        f"{start['commit']}"
        + (f", uncommitted changes in {', '.join(start['uncommitted'])}" if start["uncommitted"] else "")
        + f"). {packages}. {start['workers']} APISIX worker(s), `wrk -t1 -c{start['connections']}`, "
        f"{start['rounds']} rounds of {start['seconds']} s per case after {start['warmup_seconds']} s of "
        "warm-up.",
        "",
        "| case | req/s | of split | of trivial | p50 µs | p99 µs | p99 of split | p99 minus split µs "
        "| runner cpu µs/req | runner cpu of trivial | non-2xx + errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {describe(r['case'])} | {_fmt(r['req_per_s'])} | "
            f"{_fmt(r['of_split'], 2)} | {_fmt(r['of_trivial'], 2)} | "
            f"{_fmt(r['p50_us'])} | {_fmt(r['p99_us'])} | {_fmt(r['p99_of_split'], 2)} | "
            f"{_fmt(r['p99_minus_split_us'])} | "
            f"{_fmt(r['runner_cpu_us_per_req'])} | {_fmt(r['runner_cpu_of_trivial'], 2)} | {r['errors']} |"
        )
    if any(r["case"] in ("noop", "go-noop") for r in rows):
        lines += [
            "",
            "Against the no-op Lua plugin and the Go runner's no-op plugin, in the same rounds:",
            "",
            "| case | of noop | p99 minus noop µs | APISIX cpu minus noop µs | of Go | runner cpu of Go |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in rows:
            lines.append(
                f"| {describe(r['case'])} | {_fmt(r['of_noop'], 2)} | {_fmt(r['p99_minus_noop_us'])} | "
                f"{_fmt(r['apisix_cpu_minus_noop_us'])} | {_fmt(r['of_go'], 2)} | "
                f"{_fmt(r['runner_cpu_of_go'], 2)} |"
            )
    lines += [
        "",
        "CPU per request by process (µs, user+system over the measured window), and cores kept busy:",
        "",
        "| case | runner | APISIX | upstream nginx | wrk | total | runner cores | APISIX cores |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {describe(r['case'])} | {_fmt(r['runner_cpu_us_per_req'])} | "
            f"{_fmt(r['apisix_cpu_us_per_req'])} | {_fmt(r['upstream_cpu_us_per_req'])} | "
            f"{_fmt(r['wrk_cpu_us_per_req'])} | {_fmt(r['total_cpu_us_per_req'])} | "
            f"{_fmt(r['runner_cores'], 2)} | {_fmt(r['apisix_cores'], 2)} |"
        )
    rounds = sorted({s.round for s in samples})
    lines += [
        "",
        "req/s in each round (order rotated; load average at the end of each measurement):",
        "",
        "| case | " + " | ".join(f"round {n + 1}" for n in rounds) + " |",
        "| --- |" + " ---: |" * len(rounds),
    ]
    for r in rows:
        by_round = {s.round: s for s in samples if s.case == r["case"]}
        cells = [
            f"{by_round[n].req_per_s:,.0f} ({by_round[n].loadavg_1m:.1f})" if n in by_round else "-"
            for n in rounds
        ]
        lines.append(f"| {describe(r['case'])} | " + " | ".join(cells) + " |")
    lines.append("")
    for r in rows:
        served = ", ".join(f"{k} {v:,}" for k, v in r["served"].items())
        decided = ", ".join(f"`{k}` {v:,}" for k, v in sorted(r["decisions"].items(), key=lambda kv: -kv[1]))
        logged = ", ".join(f"{k} {v}" for k, v in r["error_log_load"].items()) or "none"
        lines.append(
            f"- {r['case']}: {r['requests']:,} measured; upstreams answered {served or 'nothing'}"
            + (f" ({r['served_non_200']} not 200)" if r["served_non_200"] else "")
            + (f"; runner decisions {decided}" if decided else "")
            + f"; error.log warn-or-worse lines in the measured windows: {logged}"
            + (f"; runner respawns: {r['runner_respawns']}" if r["runner_respawns"] else "")
            + (
                f"; runner exit codes {r['runner_exit_codes']}"
                if any(c != 0 for c in r["runner_exit_codes"])
                else ""
            )
            + "."
        )
    for r in rows:
        for n, age in enumerate(r["table_age"]):
            lines.append(
                f"- {r['case']} run {n + 1}: {age['decisions']:,.0f} fast-path decisions, "
                f"{age['within_100ms']:.4f} of them from a table at most 100 ms old; 99 % within "
                f"{age['p99_le_s'] * 1000:.0f} ms, all within {age['max_le_s'] * 1000:.0f} ms "
                "(histogram bounds)."
            )
    startup = _startup_messages(samples)
    if startup:
        lines += ["", "Warn-or-worse lines outside the measured windows (start, probe, warm-up, stop):", ""]
        lines += [f"- `{m}`" for m in startup]
    upstream = end.get("upstream_error_log") or {}
    lines += ["", f"Upstream nginx error.log, warn or worse: {upstream or 'none'}.", ""]
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    keys = [
        "case",
        "req_per_s",
        "of_split",
        "of_trivial",
        "p50_us",
        "p99_us",
        "runner_cpu_us_per_req",
        "apisix_cpu_us_per_req",
        "upstream_cpu_us_per_req",
        "wrk_cpu_us_per_req",
        "errors",
    ]
    return render_table(keys, [[r[k] for k in keys] for r in rows])


def check_prefix() -> None:
    if not (apisix.prefix() / "bin" / "apisix").exists():
        raise SystemExit(
            f"no APISIX in {apisix.prefix()}: run 'SPILLWAY_APISIX_PREFIX={apisix.prefix()} bash "
            "scripts/install-apisix.sh' (root, apt, Debian 12), or name an installed prefix with --prefix"
        )
    pid_file = apisix.prefix() / "apisix" / "logs" / "nginx.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text().strip())
        if apisix.alive(pid) and b"nginx" in Path(f"/proc/{pid}/cmdline").read_bytes():
            raise SystemExit(
                f"an APISIX already runs in {apisix.prefix()} (master pid {pid}): give this benchmark a "
                "prefix of its own (--prefix or SPILLWAY_APISIX_PREFIX; bash scripts/install-apisix.sh)"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every case (default 3)")
    parser.add_argument("--seconds", type=int, default=6, help="measured wrk seconds per case (default 6)")
    parser.add_argument(
        "--warmup-seconds", type=int, default=2, help="unmeasured wrk seconds before each (default 2)"
    )
    parser.add_argument("--workers", type=int, default=1, help="APISIX nginx workers (default 1)")
    parser.add_argument(
        "--connections", type=int, default=16, help="wrk connections, one thread (default 16)"
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        default=None,
        choices=ALL_CASES,
        help=f"default: {' '.join(DEFAULT_CASES)} (go-noop only when its binary is there)",
    )
    parser.add_argument(
        "--prefix",
        type=Path,
        default=None,
        help=f"APISIX prefix (default $SPILLWAY_APISIX_PREFIX, else {DEFAULT_PREFIX}); not a running one",
    )
    parser.add_argument("--go-runner", type=Path, default=GO_RUNNER, help=f"default {GO_RUNNER}")
    parser.add_argument(
        "--cloud-cap",
        type=int,
        default=50,
        help="the aws target's concurrency_cap (default 50, as in examples/spillway.yaml)",
    )
    parser.add_argument(
        "--budget-seconds",
        type=int,
        default=4,
        help="wrk seconds of the fast path's budget check, after the rounds when a fast case ran (0: none)",
    )
    parser.add_argument(
        "--budget-requests",
        type=int,
        default=2000,
        help="the budget check's hourly aws budget, in cold requests (default 2000)",
    )
    parser.add_argument(
        "--lua-variant",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="A/B of a change: each fast case runs again as CASE@NAME with the Lua plugins of DIR "
        "(holding apisix/plugins/spillway.lua), interleaved with the others (repeatable)",
    )
    parser.add_argument(
        "--variant-cases",
        nargs="+",
        choices=[c for c in ALL_CASES if c.startswith("fast-")],
        default=None,
        help="the fast cases the --lua-variant ones run as (default: every fast case in --cases)",
    )
    parser.add_argument("--markdown-out", type=Path, default=None, help="also write the summary as markdown")
    parser.add_argument(
        "--keep-logs", type=Path, default=None, help="copy each APISIX error.log (runner stderr too) here"
    )
    add_output_options(parser)
    args = parser.parse_args(argv)

    if args.prefix is None:
        args.prefix = Path(os.environ.get("SPILLWAY_APISIX_PREFIX") or DEFAULT_PREFIX)
    os.environ["SPILLWAY_APISIX_PREFIX"] = str(args.prefix.resolve())  # what devtools.apisix reads
    check_prefix()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            raise SystemExit(f"{tool} is not installed (bash scripts/install-apisix.sh brings it)")
    go_there = args.go_runner.exists() and os.access(args.go_runner, os.X_OK)
    if args.cases is None:
        args.cases = [c for c in DEFAULT_CASES if c != "go-noop" or go_there]
    elif "go-noop" in args.cases and not go_there:
        parser.error(f"go-noop: no executable {args.go_runner}")
    variants: dict[str, Path] = {}
    for spec in args.lua_variant:
        vname, sep, vdir = spec.partition("=")
        if not sep or not vname or not (Path(vdir) / "apisix" / "plugins" / "spillway.lua").is_file():
            parser.error(f"--lua-variant {spec}: expected NAME=DIR, DIR holding apisix/plugins/spillway.lua")
        variants[vname] = Path(vdir).resolve()
    varied = [c for c in args.cases if c.startswith("fast-") and c in (args.variant_cases or args.cases)]
    args.cases = [*args.cases, *(f"{c}@{v}" for c in varied for v in variants)]
    if BASELINE not in args.cases:
        parser.error(f"the ratios need {BASELINE} in the run")
    if "trivial" in args.cases and (
        importlib.util.find_spec("A6") is None or importlib.util.find_spec("flatbuffers") is None
    ):
        parser.error("trivial: the testbed runner needs a6pluginprotos and flatbuffers (dev extra)")

    command = shlex.join(["python", "bench/apisix_gateway.py", *(argv if argv is not None else sys.argv[1:])])
    out = Output(args.format, args.json_out)
    notes = [
        {
            **machine_note(),
            **source_note(),
            "versions": versions(args.go_runner if "go-noop" in args.cases else None),
            "prefix": str(apisix.prefix()),
            "workers": args.workers,
            "connections": args.connections,
            "rounds": args.rounds,
            "seconds": args.seconds,
            "warmup_seconds": args.warmup_seconds,
            "cases": args.cases,
            "cloud_cap": args.cloud_cap,
            "command": command,
        }
    ]
    out.record({"kind": "machine", "phase": "start", **notes[0]})
    say(
        f"APISIX in {apisix.prefix()}, {args.workers} worker(s); "
        f"load average {notes[0]['loadavg_1m']} at the start"
    )
    began = time.monotonic()
    samples: list[Sample] = []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="spillway-apisix-bench-") as tmp,
            upstream_nginx(Path(tmp)) as ups,
            metrics_feed() as feed,
        ):
            work = Path(tmp)
            setup = Setup(
                work,
                secrets.token_hex(32),
                secrets.token_hex(32),
                ups,
                feed,
                args.go_runner,
                args.cloud_cap,
                variants,
            )
            script = wrk_script(work)
            total = args.rounds * len(args.cases)
            for rnd in range(args.rounds):
                for position, name in enumerate(rotated(args.cases, rnd)):
                    s = measure(make_case(name, setup), setup, args, script, rnd, position)
                    samples.append(s)
                    out.record(jsonable(asdict(s)))
                    bad = s.socket_errors + s.non2xx + s.timeouts
                    say(
                        f"[{len(samples)}/{total}] round {rnd + 1} {name}: {s.req_per_s:,.0f}/s "
                        f"p50 {s.p50_us:,.0f} µs p99 {s.p99_us:,.0f} µs "
                        f"runner {_fmt(s.runner_cpu_us_per_req)} "
                        f"APISIX {s.apisix_cpu_us_per_req:.0f} µs/req; served {s.served}"
                        + (f"; decisions {s.decisions}" if s.decisions else "")
                        + (f"; ERRORS {bad}" if bad else "")
                        + (f"; error.log under load {s.error_log_load}" if s.error_log_load else "")
                    )
            check: dict[str, Any] | None = None
            if args.budget_seconds > 0 and any(c.startswith("fast-") for c in args.cases):
                check = budget_check(setup, args, script)
                out.record(jsonable(check))
                say(f"budget check: {check}")
            nginx_counts, nginx_messages = log_findings((ups.dir / "error.log").read_text(errors="replace"))
        rows = summarise(samples, args.cases)
        for row in rows:
            out.record(jsonable(row))
        notes.append(
            {
                **machine_note(),
                "wall_s": time.monotonic() - began,
                "upstream_error_log": nginx_counts,
                "upstream_error_log_messages": nginx_messages[:8],
            }
        )
        out.record({"kind": "machine", "phase": "end", **notes[-1]})
        say(f"done in {time.monotonic() - began:.0f} s; load average {notes[-1]['loadavg_1m']} at the end")
        if out.table:
            print(table(rows))
        if args.markdown_out is not None:
            text = markdown(rows, samples, notes, command)
            if check is not None:
                text += "\n".join(budget_markdown(check)).replace("{c}", str(args.connections)) + "\n"
            args.markdown_out.write_text(text)
    finally:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
