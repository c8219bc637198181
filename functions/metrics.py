"""The function's own Prometheus families (``spillway_function_*``), one registry per instance."""

from __future__ import annotations

import json
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
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


# At most this many GPUs are shown per instance (an FC instance has one; the label stays bounded).
MAX_GPUS = 16
_GPU = {
    "nv_gpu_utilization": ("spillway_function_gpu_utilization", "The GPU's utilisation, 0 to 1."),
    "nv_gpu_memory_used_bytes": ("spillway_function_gpu_memory_used_bytes", "GPU memory in use."),
    "nv_gpu_memory_total_bytes": ("spillway_function_gpu_memory_total_bytes", "The GPU's memory."),
}


class GpuStats(Collector):
    """Triton's GPU gauges (its metrics port, on loopback, with ``--allow-gpu-metrics``), as the
    handler last read them, per GPU: what the instance's GPU is doing, on /spillway/metrics."""

    def __init__(self) -> None:
        self.gauges: dict[str, dict[str, float]] = {}

    def read(self, text: str) -> None:
        """Triton's Prometheus text; what does not parse leaves the last reading."""
        read: dict[str, dict[str, float]] = {name: {} for name in _GPU}
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    per_gpu = read.get(sample.name)
                    gpu = sample.labels.get("gpu_uuid", "")[:64]
                    if per_gpu is not None and (gpu in per_gpu or len(per_gpu) < MAX_GPUS):
                        per_gpu[gpu] = sample.value
        except ValueError:
            return
        self.gauges = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for metric, (name, documentation) in _GPU.items():
            family = GaugeMetricFamily(name, documentation, labels=["gpu"])
            for gpu, value in sorted(self.gauges.get(metric, {}).items()):
                family.add_metric([gpu], value)
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
        self.stream_events = Counter(
            "spillway_function_stream_events",
            "Server-sent events relayed in streams (generate_stream: one per token).",
            registry=r,
        )
        self.first_event = Histogram(
            "spillway_function_stream_first_event_seconds",
            "Time from a stream's request to its first event relayed (its first token).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
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
        self.gpu = GpuStats()
        r.register(self.gpu)

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
