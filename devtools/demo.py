"""``python -m devtools demo``: the whole hybrid on one machine, a burst, and what happened.

All real and all on loopback: an "on-prem" Triton with a small, known capacity; the Spillway
runner behind a real Apache APISIX (``scripts/install-apisix.sh``; APISIX starts the runner as its
ext-plugin.cmd) or behind the development gateway; two "cloud" targets, each a local pool of
function instances with their own Triton sidecars, a start-up delay standing for image pull and
model load, and idle instances reaped; the warm-up pinger on a schedule; and an open-loop load
generator sending a steady stream well within the local capacity, a burst past it, and a steady
stream again, a share of it labelled sensitive.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devtools.demo_gateway import cluster_times, start_gateway, wait_for
from devtools.demo_monitoring import METRICS_TOKEN, monitoring, render_dashboards
from devtools.demo_report import FEEDBACK_S
from devtools.loadgen import BODY, LoadRun, Phase, generate, phase_bounds
from devtools.local_pool import PoolSettings, running_pool
from functions.sidecar import Sidecar, SidecarOptions, free_port
from gateway_plugin.config import SpillwayConfig

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_MODELS = ROOT / "examples" / "model_repository"
SIGNING_KEY = "spillway-demo-signing-key"
CLOUD = ("aws", "aliyun")
ONPREM_WARMUP_REQUESTS = 20
Gateway = Literal["apisix", "dev"]
# APISIX's http-logger posts outcomes in batches ``outcomes.batch_s`` apart (at least 1 s).
APISIX_BATCH_S = round(FEEDBACK_S["apisix"])


@dataclass(frozen=True)
class DemoSettings:
    """The demo's load, the cluster it meets and the gateway in front.

    The on-prem Triton answers one request at a time in ``local_delay_ms`` (50 ms: 20 requests/s).
    The steady phases send half that, which it meets with room to spare; the burst sends one and a
    half times it, which no queue absorbs. The runner spills when its estimate of a new request's
    latency passes ``enter_ratio`` of the target (a head start on the signals' lag: a scrape every
    200 ms) and stops below ``exit_ratio`` of it.

    The gateway reports each answer to the runner one logger batch later (``FEEDBACK_S``: 0.2 s
    for the development gateway, 1 s for APISIX).
    """

    out_dir: Path
    gateway: Gateway = "dev"
    steady_rps: float = 10.0
    burst_rps: float = 30.0
    steady_s: float = 8.0
    burst_s: float = 12.0
    cooldown_s: float = 8.0
    sensitive_share: float = 0.2
    local_delay_ms: float = 50.0
    latency_target_ms: float = 500.0
    enter_ratio: float = 0.5
    exit_ratio: float = 0.4
    onprem_headroom: float = 4.0
    cloud_start_delay_s: tuple[float, float] = (1.0, 2.0)
    pool_max: int = 2
    warm_instances: int = 2
    warmup_every_s: float = 10.0
    idle_ttl_s: float = 30.0

    @property
    def phases(self) -> list[Phase]:
        return [
            Phase("steady", self.steady_s, self.steady_rps),
            Phase("burst", self.burst_s, self.burst_rps),
            Phase("after", self.cooldown_s, self.steady_rps),
        ]


def _model_repository(root: Path, delay_ms: float) -> Path:
    """The example model with a per-request delay: a cluster whose capacity is known.

    The delay is per request, batched or not, so dynamic batching would add no throughput: it
    would only make every request of a batch wait for the whole batch, and make Triton report each
    one's compute time as the batch's. The demo's copy runs requests one at a time.
    """
    repo = root / "models"
    shutil.copytree(EXAMPLE_MODELS / "add_sub", repo / "add_sub")
    config = repo / "add_sub" / "config.pbtxt"
    text = re.sub(r"dynamic_batching\s*\{[^}]*\}", "", config.read_text())
    config.write_text(
        text + f'\nparameters: {{ key: "delay_ms" value: {{ string_value: "{delay_ms:g}" }} }}\n'
    )
    return repo


def demo_config(
    s: DemoSettings,
    triton_port: int,
    metrics_port: int,
    pools: dict[str, str],
    runner_metrics_port: int,
    gateway_port: int,
    outcomes_port: int,
) -> dict[str, Any]:
    """The runner's spillway.yaml; for the development gateway, with its ``devgateway`` section."""
    cost = {
        "usd_per_request": 0.0000002,
        "memory_gb": 4.0,
        "usd_per_gb_second": 0.0000166667,
        "expected_duration_ms": s.local_delay_ms + 5,
    }
    triton = f"http://127.0.0.1:{triton_port}"
    config: dict[str, Any] = {
        "local": {
            "endpoints": [{"url": triton, "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics"}],
            "latency_target_ms": s.latency_target_ms,
            "parallelism": 1,
            "scrape_period_s": 0.2,
        },
        "targets": [
            {
                "name": name,
                "kind": "http",
                "url": url,
                "concurrency_cap": s.warm_instances,
                "cold_start_ms": 1000 * delay + 1500,
                "idle_ttl_s": s.idle_ttl_s,
                "cost": cost,
            }
            for (name, url), delay in zip(pools.items(), s.cloud_start_delay_s, strict=True)
        ],
        "overflow": {
            "enter_ratio": s.enter_ratio,
            "exit_ratio": s.exit_ratio,
            "saturation_ratio": 50,
            "onprem_headroom": s.onprem_headroom,
        },
        "metrics": {"listen": f"127.0.0.1:{runner_metrics_port}"},
        "outcomes": {"listen": f"127.0.0.1:{outcomes_port}", "batch_s": APISIX_BATCH_S},
        "warmup": {
            "interval_s": s.warmup_every_s,
            "waves": 2,
            "ping_timeout_s": 30,
            "report_file": str(s.out_dir / "warm.prom"),
            "targets": {name: {"instances": s.warm_instances, "dwell_ms": 300} for name in pools},
        },
    }
    if s.gateway == "dev":
        config["devgateway"] = {
            "listen": f"127.0.0.1:{gateway_port}",
            "upstreams": {"local": triton, **pools},
            "plugins": [["spillway", {}]],
        }
    return config


class _Warmer:
    """The warm-up pinger on its schedule, in a thread, as cron would run it."""

    def __init__(self, config: SpillwayConfig) -> None:
        self.config = config
        self.rounds: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="warmup", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        import datetime

        from warmup.report import summary
        from warmup.rounds import plan, run_round, write_report

        while not self._stop.is_set():
            rows = plan(self.config, datetime.datetime.now(datetime.UTC), {})
            results = run_round(self.config, rows)
            write_report(self.config, results)
            self.rounds.append({"at": time.monotonic(), "targets": [summary(r) for r in results]})
            self._stop.wait(self.config.warmup.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


class Observer(Protocol):
    """What the demo tells while it runs: set-up steps, then the load as it is sent and answered."""

    def step(self, text: str) -> None: ...

    def load_started(self, phases: list[Phase], load: LoadRun, started_at: float) -> None: ...

    def load_finished(self) -> None: ...


class _Silent:
    def step(self, text: str) -> None:
        pass

    def load_started(self, phases: list[Phase], load: LoadRun, started_at: float) -> None:
        pass

    def load_finished(self) -> None:
        pass


def run(settings: DemoSettings, observer: Observer | None = None) -> dict[str, Any]:
    """Start everything, play the load, stop everything; returns what happened."""
    s = settings
    tell = observer or _Silent()
    s.out_dir.mkdir(parents=True, exist_ok=True)
    repo = _model_repository(Path(tempfile.mkdtemp(prefix="spillway-demo-")), s.local_delay_ms)
    os.environ.setdefault("SPILLWAY_SIGNING_KEY", SIGNING_KEY)
    # The runner refuses to start without a route token when a target is in upstream mode.
    os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    metrics_port = free_port()
    options = SidecarOptions(repo, ("add_sub",), 60, metrics_port=metrics_port, log_prefix="[onprem] ")
    triton = Sidecar(dataclasses.replace(options, log_path=s.out_dir / "onprem.log"))
    with contextlib.ExitStack() as stack:
        tell.step(
            "starting the on-prem Triton (one instance, "
            f"{s.local_delay_ms:g} ms per request: about {1000 / s.local_delay_ms:.0f} requests/s)"
        )
        triton.start()
        stack.callback(triton.stop)
        tell.step(f"starting two cloud targets ({', '.join(CLOUD)}), each a pool of function instances")
        pools = {name: stack.enter_context(running_pool(_pool_settings(s, repo, name))) for name in CLOUD}
        triton.wait_ready(60)
        runner_port, gateway_port = free_port(), free_port()
        urls = {name: url for name, (url, _) in pools.items()}
        config_data = demo_config(
            s, triton.http_port, metrics_port, urls, runner_port, gateway_port, free_port()
        )
        config_path = s.out_dir / "spillway.yaml"
        config_path.write_text(yaml.safe_dump(config_data, sort_keys=False))
        config = SpillwayConfig.model_validate({k: v for k, v in config_data.items() if k != "devgateway"})
        gateway = start_gateway(
            s.gateway, s.out_dir, stack, config, config_path, env, gateway_port, tell.step
        )
        exporter = gateway.get("exporter")
        live = {name: pool for name, (_, pool) in pools.items()}
        prometheus = stack.enter_context(monitoring(s.out_dir, runner_port, metrics_port, exporter, live))
        if prometheus is not None:
            also = " and APISIX's exporter" if exporter else ""
            tell.step(
                f"Prometheus on {prometheus.url} scrapes the runner, the on-prem Triton, the functions{also}"
            )
        tell.step(
            f"warming the on-prem Triton ({ONPREM_WARMUP_REQUESTS} requests), as a cluster in service is"
        )
        _warm_onprem(triton.http_port, ONPREM_WARMUP_REQUESTS)
        warmer = _Warmer(config)
        tell.step(f"warming {s.warm_instances} instance(s) per cloud target every {s.warmup_every_s:g} s")
        warmer.start()
        stack.callback(warmer.stop)
        wait_for(lambda: len(warmer.rounds) >= 1, 120)
        tell.step(
            "sending load: " + ", ".join(f"{p.name} {p.rate_per_s:g}/s for {p.seconds:g} s" for p in s.phases)
        )
        load = LoadRun()
        began = time.time()
        tell.load_started(s.phases, load, time.monotonic())
        try:
            asyncio.run(generate("127.0.0.1", gateway_port, s.phases, s.sensitive_share, load))
        finally:
            tell.load_finished()
        metrics = runner_metrics(f"http://127.0.0.1:{runner_port}/metrics")
        stats = {name: vars(pool.stats).copy() for name, (_, pool) in pools.items()}
        dashboards = None
        if prometheus is not None:
            tell.step("drawing Spillway's dashboards from Prometheus")
            dashboards = render_dashboards(prometheus, s.out_dir, began, time.time())
        tell.step("stopping every process the demo started")
    samples = [vars(x) for x in load.samples]
    if s.gateway == "apisix":
        # APISIX's access log is buffered until it quits: read once every process has stopped.
        gateway["cluster_times"] = cluster_times(samples, s.out_dir / "apisix-access.log", triton.http_port)
    return {
        "settings": _settings_dict(s),
        "gateway": gateway,
        "phases": [
            {"name": name, "start_s": start, "end_s": end, "rate_per_s": phase.rate_per_s}
            for (name, start, end), phase in zip(phase_bounds(s.phases), s.phases, strict=True)
        ],
        "samples": samples,
        "sent": load.sent,
        "answered": load.answered,
        "runner_metrics": metrics,
        "pools": stats,
        "warmup_rounds": warmer.rounds,
        "dashboards": dashboards,
        "instance_logs": {name: str(s.out_dir / f"instances-{name}") for name in CLOUD},
    }


def runner_metrics(url: str) -> dict[str, dict[str, float]]:
    """Spend, warm instances and decisions by target, from the runner's own endpoint."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    try:
        text = requests.get(url, timeout=5).text
    except requests.RequestException:
        return {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            target = sample.labels.get("target")
            if target is None:
                continue
            if sample.name == "spillway_cloud_spend_usd_total":
                out["spend_usd"][target] = sample.value
            elif sample.name == "spillway_warm_instances":
                out["warm_instances"][target] = sample.value
            elif sample.name == "spillway_decisions_total":
                out["decisions"][target] = out["decisions"].get(target, 0) + sample.value
    return dict(out)


def _pool_settings(s: DemoSettings, repo: Path, name: str) -> PoolSettings:
    log_dir = s.out_dir / f"instances-{name}"
    log_dir.mkdir(exist_ok=True)
    return PoolSettings(
        repo,
        ("add_sub",),
        s.pool_max,
        s.idle_ttl_s,
        s.cloud_start_delay_s[CLOUD.index(name)],
        log_dir=log_dir,
        env={
            "SPILLWAY_SIGNING_KEY": os.environ["SPILLWAY_SIGNING_KEY"],
            "SPILLWAY_ALLOW_UNSIGNED_PAYLOAD": "1",
            "SPILLWAY_ACCESS_LOG_HEADERS": "x-data-classification",
            "SPILLWAY_METRICS_TOKEN": METRICS_TOKEN,
        },
    )


def _warm_onprem(port: int, count: int) -> None:
    """A few inferences, one at a time, straight to the on-prem Triton: a cluster in service is warm,
    and the runner's first service-time reading should be the cluster's, not its first request's."""
    url = f"http://127.0.0.1:{port}/v2/models/add_sub/infer"
    for _ in range(count):
        request = urllib.request.Request(url, BODY, {"content-type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                answer.read()
        except OSError as exc:
            raise RuntimeError(f"the on-prem Triton did not answer a warm-up inference ({exc})") from exc


def _settings_dict(s: DemoSettings) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(s).items()}
