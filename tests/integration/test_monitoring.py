"""Spillway operated as an operator would: a real Prometheus scraping the real runner, a real
function (its Triton sidecar), the on-prem Triton and APISIX's own exporter, after a short mixed
load through both routes of a real APISIX. Every dashboard panel's query returns data, every
recording rule evaluates, the bill equals the runners' counters to the cent, and the audit trail
has a line for every request on both routes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devtools import apisix
from devtools import prometheus as prometheus_server
from functions.sidecar import Sidecar, SidecarOptions, free_port
from functions.signature import sign
from gateway_plugin import bill
from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from testing.apisix import example_plugins, gateway_for, needs_apisix
from testing.function import function_server, model_repository
from testing.http import QuietHandler, http, http_server_thread, wait_until
from testing.paths import ROOT, TEST_MODELS

needs_prometheus = pytest.mark.skipif(
    prometheus_server.missing_reason() is not None, reason=prometheus_server.missing_reason() or ""
)
pytestmark = [pytest.mark.integration, needs_apisix(), needs_prometheus]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"]
SIGNING_KEY = "monitoring-signing-key-0123456789abcdef"
METRICS_TOKEN = "monitoring-metrics-token-0123456789"
FAST_HOST = "fast.test"
# What $__rate_interval stands for here (Prometheus scrapes every second): long enough that the
# load, which ends before the streams and the warm-up run, is still in every rate the panels read.
RATE_INTERVAL = "5m"
BODY = json.dumps({"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "FP32", "data": [5]}]}).encode()


@dataclass
class World:
    gateway: apisix.Apisix
    prometheus: prometheus_server.Prometheus
    runner_metrics: str
    audit_log: Path
    sent: int
    started: float


def _config(tmp: Path, triton: Sidecar, metrics_url: str, function_url: str) -> dict[str, Any]:
    return {
        "local": {
            "endpoints": [{"url": f"http://127.0.0.1:{triton.http_port}", "metrics_url": metrics_url}],
            "latency_target_ms": 150,
            "model_latency_targets_ms": {"slow": 150},
            "scrape_period_s": 0.1,
            "stale_after_s": 1.0,
            "cost": {"gpus": 2, "usd_per_gpu_hour": 36.0},
            # Past what the GPU stand-in reports: drawn on the dashboards, never what spills here.
            "thresholds": {"gpu_utilization": 0.95, "gpu_memory": 0.9},
        },
        "targets": [
            {
                "name": "fn",
                "kind": "http",
                "url": function_url,
                "cold_start_ms": 0,
                "concurrency_cap": 50,
                "cost": {"usd_per_request": 0.01, "expected_duration_ms": 100},
            }
        ],
        "overflow": {"saturation_ratio": 50},
        "budgets": {"per_target_hourly_usd": {"fn": 100.0}, "per_target_daily_usd": {"fn": 1000.0}},
        "tenants": {"quotas": {"tiny": {"requests_per_minute": 1}}},
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
        "audit": {"logger": "file-logger", "conf": {"path": str(tmp / "audit.log")}},
        "warmup": {
            "report_file": str(tmp / "warm.prom"),
            "targets": {"fn": {"instances": 1, "dwell_ms": 50}},
        },
    }


def _routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    parsed = SpillwayConfig.model_validate(config)
    ext = route(parsed, TOKEN.encode(), prometheus=True)
    fast = fast_route(parsed, TOKEN.encode(), prometheus=True)
    fast["host"] = FAST_HOST
    return [yaml.safe_load(yaml.safe_dump(r)) for r in (ext, fast)]


def _load_local(url: str, stop: threading.Event) -> None:
    """Requests straight to the on-prem Triton, so its queue grows and the runner spills."""
    client = httpclient.InferenceServerClient(url, connection_timeout=30, network_timeout=30)
    tensor = httpclient.InferInput("DELAY_MS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([120], dtype=np.float32))
    while not stop.is_set():
        client.infer("slow", [tensor])


def _send(gateway: apisix.Apisix, fast: bool, **headers: str) -> tuple[int, str]:
    sent = {"content-type": "application/json", **({"host": FAST_HOST} if fast else {}), **headers}
    status, answer, _ = http("POST", gateway.url + "/v2/models/slow/infer", BODY, sent, timeout=30)
    return status, str(answer.get("x-spillway-decision", ""))


def _drive(gateway: apisix.Apisix, triton_url: str, prometheus: prometheus_server.Prometheus) -> int:
    """Calm, then a burst past the cluster (public requests spill), with confidential requests and
    a tenant over its quota throughout; on both routes. The burst comes in waves with a scrape of
    every target between two (a counter Prometheus first sees after it moved shows no rate until
    it moves again). How many requests were sent."""
    sent = 0
    for i in range(10):
        for fast in (False, True):
            _send(
                gateway, fast, **{"x-data-classification": "public", "x-tenant": "acme" if i % 2 else "beta"}
            )
            sent += 1
    stop = threading.Event()
    loaders = [threading.Thread(target=_load_local, args=(triton_url, stop), daemon=True) for _ in range(4)]
    for loader in loaders:
        loader.start()
    try:
        wait_until(
            lambda: _send(gateway, False, **{"x-data-classification": "public"})[1].startswith("fn;"),
            60,
            "a spill",
        )
        sent += 1  # at least the one that spilled; the wait's others are counted below from the metrics
        statuses = []
        for _ in range(3):
            wave = time.time()
            wait_until(lambda at=wave: prometheus.scraped_since(at), 60, "a scrape between waves")
            with ThreadPoolExecutor(4) as pool:
                jobs = []
                for i in range(20):
                    tenant = ("acme", "beta", "tiny", "gamma")[i % 4]
                    label = "confidential" if i % 5 == 0 else "public"
                    headers = {"x-data-classification": label, "x-tenant": tenant}
                    jobs.append(pool.submit(_send, gateway, i % 2 == 1, **headers))
                statuses += [job.result()[0] for job in jobs]
        sent += len(statuses)
        assert 429 in statuses, "the tenant over its quota was not shed"
    finally:
        stop.set()
        for loader in loaders:
            loader.join(30)
    return sent


def _warm_up(config_path: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "warmup", "run", "--once", "--config", str(config_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _function_ready(url: str) -> bool:
    try:
        status, _, body = http(
            "GET", url + "/spillway/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"}
        )
    except OSError:
        return False
    return status == 200 and _value(body.decode(), "spillway_function_sidecar_up") == 1


GPU_GAUGES = """\
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-5e1f0c2a"} 0.35
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-5e1f0c2a"} 85899345920
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-5e1f0c2a"} 34359738368
"""


@contextmanager
def _with_a_gpu(triton_metrics: str) -> Iterator[str]:
    """The on-prem Triton's metrics page as it reads with a GPU: the real page, and one GPU's
    gauges in Triton's format after it (this machine has no GPU, so the real tritonserver exports
    none; these are what the runner reads for local.thresholds and the GPU panels draw)."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            status, _, page = http("GET", triton_metrics, timeout=5)
            body = page.rstrip(b"\n") + b"\n" + GPU_GAUGES.encode() if status == 200 else b""
            self.send_response(status)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with http_server_thread(Handler) as url:
        yield url + "/metrics"


def _value(metrics: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(metrics) for s in f.samples if s.name == name)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("monitoring")
    with ExitStack() as stack:
        shutil.copytree(TEST_MODELS / "slow", tmp / "onprem" / "slow")
        triton_metrics = free_port()
        triton = Sidecar(SidecarOptions(tmp / "onprem", ("slow",), 30, metrics_port=triton_metrics))
        triton.start()
        stack.callback(triton.stop)
        triton.wait_ready(60)
        function = stack.enter_context(
            function_server(
                model_repository(tmp, "slow", "tokens"),
                tmp,
                wait_ready=False,
                SPILLWAY_SIGNING_KEY=SIGNING_KEY,
                SPILLWAY_METRICS_TOKEN=METRICS_TOKEN,
                SPILLWAY_ALLOW_UNSIGNED_PAYLOAD="1",
            )
        )
        # Ready, asked through its metrics (which a scrape may read without a signature, and which do
        # not count as the instance's first request): the first inference is still a cold one.
        wait_until(lambda: _function_ready(function.url), 60, "the function's sidecar ready")
        with_a_gpu = stack.enter_context(_with_a_gpu(f"http://127.0.0.1:{triton_metrics}/metrics"))
        config = _config(tmp, triton, with_a_gpu, function.url)
        exporter = free_port()
        gateway = stack.enter_context(
            gateway_for(
                config,
                tmp,
                _routes(config),
                plugins=[*example_plugins(), "spillway", "file-logger", "prometheus"],
                signing_key=SIGNING_KEY,
                plugin_attr={
                    "prometheus": {
                        "export_addr": {"ip": "127.0.0.1", "port": exporter},
                        "refresh_interval": 1,
                    }
                },
            )
        )
        jobs = [
            prometheus_server.Job("spillway-runner", (config["metrics"]["listen"],)),
            prometheus_server.Job("apisix", (f"127.0.0.1:{exporter}",), "/apisix/prometheus/metrics"),
            prometheus_server.Job("triton-onprem", (f"127.0.0.1:{triton_metrics}",)),
            prometheus_server.Job(
                "spillway-function-fn",
                (function.url.removeprefix("http://"),),
                "/spillway/metrics",
                METRICS_TOKEN,
            ),
        ]
        prometheus = stack.enter_context(prometheus_server.running(free_port(), jobs, tmp / "prometheus"))
        started = time.time()
        wait_until(lambda: prometheus.scraped_since(started), 60, "Prometheus's first scrape of every target")
        sent = _drive(gateway, f"127.0.0.1:{triton.http_port}", prometheus)
        _stream_tokens(function.url)
        _warm_up(tmp / "spillway.yaml", {**os.environ, "SPILLWAY_SIGNING_KEY": SIGNING_KEY})
        runner_metrics = f"http://{config['metrics']['listen']}/metrics"

        def scraped() -> bool:
            now = http("GET", runner_metrics)[2].decode()
            total = _value(now, "spillway_requests_total")
            seen = prometheus.query("sum(spillway_requests_total)")
            warm = prometheus.query("spillway_warmup_warm_instances")
            # A counter's rate needs two of its samples: the warm-up's spend first appears with the
            # report, one scrape before its panels can show it.
            spent = prometheus.query("max by (target) (rate(spillway_warmup_spend_usd_total[1m]))")
            return bool(seen and warm and spent) and float(seen[0]["value"][1]) == total

        done = time.time()
        wait_until(lambda: prometheus.scraped_since(done + 2), 60, "scrapes after the load and the warm-up")
        wait_until(scraped, 60, "Prometheus to scrape the runner after the load and the warm-up")
        yield World(gateway, prometheus, runner_metrics, tmp / "audit.log", sent, started)


def _stream_tokens(url: str) -> None:
    """A few generations streamed by the function itself (its stream panel's data)."""
    target = "/v2/models/tokens/generate_stream"
    for _ in range(3):
        body = json.dumps({"text_input": "alpha beta gamma", "max_tokens": 3, "token_delay_ms": 5}).encode()
        headers = {"x-spillway-signature": sign(SIGNING_KEY.encode(), "POST", target, None)}
        status, _, answer = http("POST", url + target, body, headers, timeout=30)
        assert status == 200 and answer.count(b"data:") == 3, answer


def _panel_queries() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted((ROOT / "ops" / "grafana" / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                found.append(
                    (path.stem, panel["title"], target["expr"].replace("$__rate_interval", RATE_INTERVAL))
                )
    return found


def test_prometheus_scrapes_every_process(world: World) -> None:
    assert world.prometheus.targets_up() == {
        "spillway-runner": True,
        "apisix": True,
        "triton-onprem": True,
        "spillway-function-fn": True,
    }


def test_every_dashboard_panel_shows_data(world: World) -> None:
    empty = [
        f"{board}: {title}: {expr}"
        for board, title, expr in _panel_queries()
        if not _shows(world.prometheus.query(expr))
    ]
    assert not empty, "panels without data:\n" + "\n".join(empty)


def _shows(result: list[dict[str, Any]]) -> bool:
    """At least one series with a number (a ratio of nothing is NaN: no data to a reader)."""
    return any(series["value"][1] != "NaN" for series in result)


def test_every_recording_rule_evaluates(world: World) -> None:
    from tests.unit.test_ops_files import recording_rules

    def missing() -> list[str]:
        return [name for name in recording_rules() if not world.prometheus.query(name)]

    # Rules are evaluated every second: wait for one evaluation after the load.
    wait_until(lambda: not missing(), 30, f"every recording rule to have a value ({missing()} had none)")


def test_the_bill_equals_the_runners_counters_to_the_cent(world: World) -> None:
    end = time.time()
    made = bill.from_prometheus(
        world.prometheus.url,
        _utc(world.started - 5),
        _utc(end),
        peak_window="30s",
    )
    counted = {
        "cloud": world.prometheus.query("sum(spillway_cloud_spend_usd_total)", end),
        "onprem": world.prometheus.query("sum(spillway_local_cost_usd_total)", end),
        "requests": world.prometheus.query("sum(spillway_requests_total)", end),
        "warmup": world.prometheus.query("sum(max by (target) (spillway_warmup_spend_usd_total))", end),
    }
    cloud, onprem, requests, warmup = (
        float(counted[k][0]["value"][1]) for k in ("cloud", "onprem", "requests", "warmup")
    )
    assert cloud > 0.2 and onprem > 0.2, "too little spend for a cent to mean anything"
    assert abs(made.summary["routed_usd"] - cloud) < 0.005, (made.summary, cloud)
    # The warm-up's counter read once per target every bill.WARMUP_STEP_S: a round in the last
    # step of the period may be left to the next one.
    assert warmup > 0 and 0 <= made.summary["warmup_usd"] <= warmup + 1e-9, (made.summary, warmup)
    assert made.summary["cloud_usd"] == pytest.approx(made.summary["routed_usd"] + made.summary["warmup_usd"])
    assert abs(made.summary["onprem_usd"] - onprem) < 0.005, (made.summary, onprem)
    assert made.summary["requests"] == requests
    assert {r.target for r in made.rows} == {"local", "fn"}
    assert {"acme", "beta", "gamma"} <= {r.tenant for r in made.rows}
    assert made.summary["bursting_saved_pct"] is not None, json.dumps(made.summary)
    assert made.summary["gpus_for_peak"] >= 2, made.summary


def test_the_audit_trail_has_every_request_on_both_routes(world: World) -> None:
    lines = [json.loads(line) for line in world.audit_log.read_text().splitlines()]
    assert len(lines) >= world.sent
    assert {line["via"] for line in lines} == {"ext_plugin", "fast_path"}
    assert {line["decision"] for line in lines} >= {"local", "cloud", "shed"}
    text = world.audit_log.read_text()
    assert SIGNING_KEY not in text and TOKEN not in text


def _utc(at: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC)


def test_the_dashboards_render_from_the_real_data(world: World, tmp_path: Path) -> None:
    """The docs' pictures (docs/images): each dashboard drawn from Prometheus' answers over the run, every
    panel with data (SPILLWAY_RENDER_TO names a folder to keep them in)."""
    from devtools.dashboard_render import render

    keep = os.environ.get("SPILLWAY_RENDER_TO")
    out = Path(keep) if keep else tmp_path
    for path in sorted((ROOT / "ops" / "grafana" / "dashboards").glob("*.json")):
        empty = render(world.prometheus, path, world.started, time.time(), out / f"{path.stem}.png")
        assert not empty, f"{path.name}: panels drawn without data: {empty}"
