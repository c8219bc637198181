"""What a real APISIX fronts in the tests: upstreams that say who they are, a feed of Triton's
metrics the test turns up and down, and the trio most stacks stand on (a local upstream, a cloud
one named ``aws`` and the feed the runner scrapes), with the spillway.yaml that names them."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from functions.sidecar import free_port
from testing.http import QuietHandler, http_server_thread

# What the route's active health checks ask the on-prem nodes (apisix_route's _LOCAL_CHECKS).
HEALTH_CHECK_PATH = "/v2/health/ready"
# The content type Triton's metrics port answers with.
PROMETHEUS_TEXT = "text/plain; version=0.0.4"


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


def metrics_handler(feed: MetricsFeed, content_type: str | None = PROMETHEUS_TEXT) -> type[QuietHandler]:
    """Serves ``feed``'s Triton metrics text on every GET, as a member's metrics port does
    (``content_type`` None: no such header)."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            body = feed.text().encode()
            self.send_response(200)
            if content_type is not None:
                self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def metrics_feed() -> Iterator[MetricsFeed]:
    """A ``MetricsFeed`` on a loopback port (its ``url`` ends in /metrics)."""
    feed = MetricsFeed()
    with http_server_thread(metrics_handler(feed)) as url:
        feed.url = url + "/metrics"
        yield feed


@dataclass
class StandIns:
    """The trio a stack stands on: the on-prem cluster (``local``), the cloud function (``aws``)
    and the Triton metrics the runner scrapes for the cluster (``feed``)."""

    local: Upstream
    aws: Upstream
    feed: MetricsFeed

    def config(self, signing_key_env: str | None = None) -> dict[str, Any]:
        """spillway.yaml for them: one local endpoint, one "aws" target, a tiny tenant quota, a
        breaker that opens after 3 failures, the runner's metrics and outcomes on free ports."""
        return {
            "local": {
                "endpoints": [{"url": self.local.url, "metrics_url": self.feed.url}],
                "latency_target_ms": 200,
                "scrape_period_s": 0.1,
                "stale_after_s": 1.0,
            },
            "targets": [
                {
                    "name": "aws",
                    "kind": "http",
                    "url": self.aws.url,
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


@contextmanager
def stand_ins(aws_instance: str | None = "fn-1", nodelay: bool = False) -> Iterator[StandIns]:
    """The trio, started in that order and stopped after: ``aws`` answers as instance
    ``aws_instance`` (None: no instance header); ``nodelay`` is the local upstream's."""
    with (
        upstream("local", nodelay=nodelay) as local,
        upstream("aws", instance=aws_instance) as aws,
        metrics_feed() as feed,
    ):
        yield StandIns(local, aws, feed)
