"""What the real-APISIX tests stand APISIX in front of: upstreams that say who they are, a feed of
Triton's metrics the test turns up and down, and the route made from the config."""

from __future__ import annotations

import json
import os
import re
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import apisix
from functions.sidecar import free_port
from gateway_plugin.apisix_route import route, standalone_yaml
from gateway_plugin.config import SpillwayConfig
from tests.support import ROOT, QuietHandler, http, http_server_thread, wait_until

EXAMPLE_CONFIG = ROOT / "examples" / "apisix" / "config.yaml"
# What the route's active health checks ask the on-prem nodes (apisix_route's _LOCAL_CHECKS).
HEALTH_CHECK_PATH = "/v2/health/ready"


def needs_apisix() -> pytest.MarkDecorator:
    reason = apisix.missing_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


@dataclass
class Upstream:
    """An HTTP upstream that answers with its name, the request it saw and, for cloud ones, an
    instance id (``instance``, which a test may change); ``status`` and ``delay_s`` make it fail
    or slow. ``in_flight`` counts the requests APISIX proxied, not its health checks."""

    name: str
    status: int = 200
    delay_s: float = 0.0
    instance: str | None = None
    seen: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    in_flight: int = 0
    max_in_flight: int = 0
    # Headers it adds to every answer (what a hostile upstream might send).
    extra_headers: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def upstream(
    name: str,
    instance: str | None = None,
    tls: ssl.SSLContext | None = None,
    host: str = "127.0.0.1",
    nodelay: bool = False,
) -> Iterator[Upstream]:
    """With ``nodelay``, Nagle's algorithm off: the head and the body go out in two writes, and
    with it each answer on a kept-alive connection waits out the gateway's delayed ACK (40 ms),
    which a flood of requests would spend most of its time on."""
    state = Upstream(name, instance=instance)

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = nodelay

        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path == HEALTH_CHECK_PATH:
                # APISIX's active health check, answered at once as Triton's readiness is, apart
                # from the inferences a test holds or fails.
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            seen = {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "header_list": [[k, v] for k, v in self.headers.items()],
            }
            state.seen.append(seen)
            with state.lock:
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            if state.delay_s:
                time.sleep(state.delay_s)
            with state.lock:
                state.in_flight -= 1
            reply = json.dumps({"upstream": name, **seen, "body": len(body)}).encode()
            self.send_response(state.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            if state.instance is not None:
                self.send_header("x-spillway-instance", state.instance)
            for header, value in state.extra_headers.items():
                self.send_header(header, value)
            self.end_headers()
            self.wfile.write(reply)

        do_GET = do_POST = _answer

    with http_server_thread(Handler, tls, host) as url:
        state.url = url
        yield state


@dataclass
class MetricsFeed:
    """Triton's cumulative counters for one model, moving by 10 requests per scrape, and its
    pending count: unless set, the queue its queue time implies (one instance). With
    ``gpu_memory_share`` set, one GPU's memory gauges as Triton exports them with a GPU (this
    machine has none, so no real Triton here reports them)."""

    queue_ms: float = 0.0
    compute_ms: float = 10.0
    pending: int | None = None
    gpu_memory_share: float | None = None
    url: str = ""
    _success: float = 0.0
    _queue_us: float = 0.0
    _compute_us: float = 0.0

    @property
    def scrapes(self) -> int:
        return int(self._success // 10)

    def _pending(self) -> int:
        return round(self.queue_ms / self.compute_ms) if self.pending is None else self.pending

    def text(self) -> str:
        self._success += 10
        self._queue_us += 10 * self.queue_ms * 1000
        self._compute_us += 10 * self.compute_ms * 1000
        labels = '{model="add_sub",version="1"}'
        return (
            f"nv_inference_request_success{labels} {self._success}\n"
            f"nv_inference_queue_duration_us{labels} {self._queue_us}\n"
            f"nv_inference_compute_infer_duration_us{labels} {self._compute_us}\n"
            f"nv_inference_pending_request_count{labels} {self._pending()}\n"
        ) + self._gpu()

    def _gpu(self) -> str:
        if self.gpu_memory_share is None:
            return ""
        gpu, total = '{gpu_uuid="GPU-5e1f0c2a"}', 80e9
        return (
            "# TYPE nv_gpu_memory_total_bytes gauge\n"
            f"nv_gpu_memory_total_bytes{gpu} {total:.0f}\n"
            "# TYPE nv_gpu_memory_used_bytes gauge\n"
            f"nv_gpu_memory_used_bytes{gpu} {self.gpu_memory_share * total:.0f}\n"
        )


@contextmanager
def metrics_feed() -> Iterator[MetricsFeed]:
    feed = MetricsFeed()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            body = feed.text().encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with http_server_thread(Handler) as url:
        feed.url = url + "/metrics"
        yield feed


def example_plugins() -> list[str]:
    """The plugins list of examples/apisix/config.yaml (a list there replaces APISIX's default)."""
    return list(yaml.safe_load(EXAMPLE_CONFIG.read_text())["plugins"])


def runner_cmd(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "gateway_plugin", "run", "--config", str(config_path)]


def spillway_route(config: dict[str, Any]) -> dict[str, Any]:
    """The route ``python -m gateway_plugin apisix-route`` makes from ``config``."""
    made = route(SpillwayConfig.model_validate(config), os.environ["SPILLWAY_ROUTE_TOKEN"].encode())
    return yaml.safe_load(standalone_yaml(made))["routes"][0]  # type: ignore[no-any-return]


def fast_path_settings(
    config: dict[str, Any], tmp: Path, port: int, routes: list[dict[str, Any]], **settings: Any
) -> apisix.ApisixSettings:
    """``apisix_settings`` with the fast path's ``spillway`` plugin enabled too."""
    return apisix_settings(
        config, tmp, port, routes=routes, **{"plugins": [*example_plugins(), "spillway"], **settings}
    )


def apisix_settings(
    config: dict[str, Any], tmp: Path, port: int, routes: list[dict[str, Any]] | None = None, **settings: Any
) -> apisix.ApisixSettings:
    """APISIX with the example config's plugins and Spillway's Lua as ``config_snippet`` says (its
    path, shared dict and plugin_attr; ``attr`` adds to the latter), the route made from ``config``
    (or ``routes``), and the runner as its ext-plugin.cmd with the route token passed through."""
    from gateway_plugin.fast_path.route import config_snippet

    path = tmp / "spillway.yaml"
    path.write_text(yaml.safe_dump(config))
    snippet = config_snippet(SpillwayConfig.model_validate(config))
    defaults: dict[str, Any] = {
        "port": port,
        "routes_yaml": yaml.safe_dump({"routes": routes or [spillway_route(config)]}, sort_keys=False),
        "runner_cmd": runner_cmd(path),
        "plugins": example_plugins(),
        "envs": ["SPILLWAY_ROUTE_TOKEN"],
        "extra_lua_path": Path(snippet["apisix"]["extra_lua_path"]).parent,
        "shared_dicts": snippet["nginx_config"]["http"]["custom_lua_shared_dict"],
        "plugin_attr": {"spillway": {**snippet["plugin_attr"]["spillway"], **settings.pop("attr", {})}},
        "discovery": snippet.get("discovery"),
    }
    return apisix.ApisixSettings(**{**defaults, **settings})


@dataclass
class Stack:
    """One APISIX with a local and an "aws" upstream and the Triton metrics feed its runner scrapes."""

    gateway: apisix.Apisix
    local: Upstream
    aws: Upstream
    feed: MetricsFeed
    metrics_url: str

    def send(
        self, classification: str | None = None, path: str = "/v2/models/add_sub/infer", **headers: str
    ) -> dict[str, Any]:
        sent = {"content-type": "application/json", **headers}
        if classification is not None:
            sent["x-data-classification"] = classification
        status, answer_headers, body = http("POST", self.gateway.url + path, b"{}", sent)
        decoded = json.loads(body) if body.startswith(b"{") else {}
        return {**decoded, "status": status, "answer_headers": answer_headers}

    def decision(self, answer: dict[str, Any]) -> str:
        return str(answer["answer_headers"].get("x-spillway-decision", ""))

    def metrics(self) -> str:
        return http("GET", self.metrics_url)[2].decode()

    def local_wait_s(self) -> float:
        found = re.search(r'spillway_local_wait_seconds\{model="add_sub"\} ([0-9.e+-]+)', self.metrics())
        return float(found.group(1)) if found else 0.0

    def set_load(self, queue_ms: float) -> None:
        """Triton's queue time as the runner will scrape it; wait until a public request shows it."""
        self.feed.queue_ms = queue_ms
        want = "aws;" if queue_ms > 200 else "local;local_ok"
        wait_until(lambda: self.decision(self.send("public")).startswith(want), 30, f"decisions {want}")


def stack_config(
    local: Upstream, aws: Upstream, feed: MetricsFeed, signing_key_env: str | None = None
) -> dict[str, Any]:
    """spillway.yaml for a ``Stack``: one local endpoint, one "aws" target, a tiny tenant quota."""
    return {
        "local": {
            "endpoints": [{"url": local.url, "metrics_url": feed.url}],
            "latency_target_ms": 200,
            "scrape_period_s": 0.1,
            "stale_after_s": 1.0,
        },
        "targets": [
            {
                "name": "aws",
                "kind": "http",
                "url": aws.url,
                "signing_key_env": signing_key_env,
                "cold_start_ms": 0,
                "concurrency_cap": 10_000,
            }
        ],
        "tenants": {"quotas": {"tiny": {"requests_per_minute": 1}}},
        "breaker": {"consecutive_failures": 3, "cooldown_s": 600},
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
    }
