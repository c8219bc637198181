"""The function's own Prometheus families (``spillway_function_*``), one registry per instance."""

from __future__ import annotations

import json
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_LATEST


class TritonStats(Collector):
    """Triton's own cumulative time per model (its statistics: queue, compute, successes), as the
    handler last read them, shown on /spillway/metrics: a function's sidecar has no port anyone
    scrapes. Models are the function's own (its repository), so the labels are bounded."""

    def __init__(self) -> None:
        self.models: dict[str, tuple[float, float, float]] = {}

    def read(self, body: bytes) -> None:
        """Triton's ``GET /v2/models/stats`` answer; what does not parse leaves the last reading."""
        try:
            stats = json.loads(body)["model_stats"]
            read = {}
            for model in stats:
                inference = model["inference_stats"]
                read[str(model["name"])[:128]] = (
                    inference["queue"]["ns"] / 1e9,
                    inference["compute_infer"]["ns"] / 1e9,
                    float(inference["success"]["count"]),
                )
        except (ValueError, KeyError, TypeError):
            return
        self.models = dict(list(read.items())[:100])

    def collect(self) -> Iterator[CounterMetricFamily]:
        families = (
            ("spillway_function_triton_queue_seconds", "Time requests waited in Triton's queue."),
            ("spillway_function_triton_compute_seconds", "Time Triton spent computing inferences."),
            ("spillway_function_triton_inferences", "Inferences Triton completed."),
        )
        for position, (name, documentation) in enumerate(families):
            family = CounterMetricFamily(name, documentation, labels=["model"])
            for model, values in sorted(self.models.items()):
                family.add_metric([model], values[position])
            yield family


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
        self.triton = TritonStats()
        r.register(self.triton)

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
