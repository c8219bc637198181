"""The function's own Prometheus families (``spillway_function_*``), one registry per instance."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class FunctionMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        r = self.registry
        self.requests = Counter(
            "spillway_function_requests",
            "Requests answered, by kind and status code.",
            ["kind", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "spillway_function_request_seconds",
            "Time from request to answer, by kind.",
            ["kind"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.cold_starts = Counter(
            "spillway_function_cold_starts", "Requests that were the first an instance served.", registry=r
        )
        self.init_seconds = Gauge(
            "spillway_function_init_seconds", "Process start to sidecar ready on this instance.", registry=r
        )
        self.sidecar_up = Gauge(
            "spillway_function_sidecar_up", "1 while the Triton sidecar is ready.", registry=r
        )
        self.sidecar_restarts = Counter(
            "spillway_function_sidecar_restarts", "Times the Triton sidecar was restarted.", registry=r
        )
        self.warmups = Counter(
            "spillway_function_warmups",
            "Warm-up pings answered, by whether the instance was cold.",
            ["cold"],
            registry=r,
        )

    def observe(self, kind: str, status: int, seconds: float) -> None:
        """Per-request accounting; label children are looked up once and cached."""
        key = (kind, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = (self.requests.labels(kind, str(status)), self.latency.labels(kind))
        child[0].inc()
        child[1].observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
