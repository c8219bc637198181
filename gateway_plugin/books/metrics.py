"""The runner's Prometheus families (``spillway_*``), served on their own port."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from gateway_plugin.books.cost_series import CostSeries
from gateway_plugin.config import SpillwayConfig

# Upper bounds (seconds) of the fast path's table-age buckets, as apisix/plugins/spillway/report.lua.
TABLE_AGE_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class BucketCounts(Collector):
    """A histogram whose observations arrive already counted per bucket (the fast path's workers
    sum them up), so that thousands of them cost one addition per bucket."""

    def __init__(self, name: str, documentation: str, bounds: Sequence[float]) -> None:
        self.name, self.documentation, self.bounds = name, documentation, tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def add(self, counts: Sequence[int], total: float) -> None:
        """Per-bucket counts (the last one past every bound) and the sum of what they counted."""
        for i, n in enumerate(counts[: len(self.counts)]):
            self.counts[i] += n
        self.sum += total

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, running = [], 0
        for bound, n in zip((*(str(b) for b in self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            cumulative.append((bound, running))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=self.sum)


class Sometimes:
    """At most once per ``period_s``: what clients can trigger at every request is logged once in
    a while (and counted every time in a metric), so they cannot flood the log."""

    def __init__(self, period_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.period_s, self.clock = period_s, clock
        self._next = float("-inf")
        self._lock = threading.Lock()

    def due(self) -> bool:
        with self._lock:
            now = self.clock()
            if now < self._next:
                return False
            self._next = now + self.period_s
            return True


class RunnerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._said: dict[str, Sometimes] = {}
        self._decision_children: dict[tuple[str, str], Counter] = {}
        self.decisions = Counter(
            "spillway_decisions", "Routing decisions, by target and reason.", ["target", "reason"], registry=r
        )
        self.residency_kept = Counter(
            "spillway_residency_kept",
            "Requests a rule would have sent out but residency kept on premises.",
            registry=r,
        )
        self.content_matches = Counter(
            "spillway_content_matches",
            "Requests that would have left and whose text a content detector matched (the first that "
            "did, in order): kept on premises.",
            ["detector"],
            registry=r,
        )
        self.content_unscannable = Counter(
            "spillway_content_unscannable",
            "Requests that would have left and whose text could not be read (too_large, unknown_size, "
            "not_json, binary_text, trailing_bytes; content.unscannable says whether they stayed) or "
            "whose scan ran past content.scan_budget_ms (over_budget: they stayed).",
            ["reason"],
            registry=r,
        )
        self.local_wait = Gauge(
            "spillway_local_wait_seconds",
            "Estimated wait of a new request on the cluster.",
            ["model"],
            registry=r,
        )
        self.overflowing = Gauge(
            "spillway_overflowing", "1 while a model spills to the cloud.", ["model"], registry=r
        )
        self.threshold_value = Gauge(
            "spillway_local_threshold_value",
            "The cluster's value of a local.thresholds gauge at the last scrape (NaN: not reported).",
            ["threshold"],
            registry=r,
        )
        self.threshold_limit = Gauge(
            "spillway_local_threshold_limit",
            "The limit past which that gauge makes the cluster overflow.",
            ["threshold"],
            registry=r,
        )
        self.local_failing = Gauge(
            "spillway_local_failing",
            "1 while the cluster's own answers fail for a model (its breaker open or probing): "
            "requests that may leave go out, on-prem-only ones get 503.",
            ["model"],
            registry=r,
        )
        self.signals_fresh = Gauge(
            "spillway_signals_fresh",
            "1 while Triton's metrics are fresh; 0 keeps everything local.",
            registry=r,
        )
        self.scrape_errors = Counter(
            "spillway_signal_scrape_errors",
            "Rounds of metrics scraping in which no member answered.",
            registry=r,
        )
        self.local_members = Gauge(
            "spillway_local_members",
            "On-prem members by state (up, failing, down, wedged: metrics answer, inference fails).",
            ["state"],
            registry=r,
        )
        self.local_capacity = Gauge(
            "spillway_local_capacity",
            "Requests of a model the on-prem members that count run at once (the policy's capacity; "
            "model * is every model's).",
            ["model"],
            registry=r,
        )
        self.spend = Counter("spillway_cloud_spend_usd", "Estimated cloud spend.", ["target"], registry=r)
        self.breaker_open = Gauge(
            "spillway_breaker_open",
            "1 while a target's breaker is open or half-open.",
            ["target"],
            registry=r,
        )
        self.in_flight = Gauge(
            "spillway_target_in_flight", "Requests in flight per target.", ["target"], registry=r
        )
        self.warm = Gauge(
            "spillway_warm_instances", "Instances seen warm within the idle TTL.", ["target"], registry=r
        )
        self.cold_hits = Counter(
            "spillway_cold_hits", "Requests answered by a cold instance.", ["target"], registry=r
        )
        self.target_latency = Histogram(
            "spillway_target_latency_seconds", "Invoke-mode latency per target.", ["target"], registry=r
        )
        self.invoke_failures = Counter(
            "spillway_invoke_failures", "Failed invocations per target.", ["target"], registry=r
        )
        self.outcome_fields_invalid = Counter(
            "spillway_outcome_fields_invalid",
            "Outcome fields that were malformed (a client's header too long, bytes not UTF-8) and read "
            "as absent; the rest of each entry was taken.",
            ["field"],
            registry=r,
        )
        self.fast_path_fail_safe = Counter(
            "spillway_fast_path_fail_safe",
            "Fast-path decisions made without a usable table (stale, missing or malformed): local or shed.",
            registry=r,
        )
        self.fast_path_table_age = BucketCounts(
            "spillway_fast_path_table_age_seconds",
            "Age of the decision table each fast-path decision was made from.",
            TABLE_AGE_BOUNDS,
        )
        r.register(self.fast_path_table_age)
        self.fast_path_dropped = Counter(
            "spillway_fast_path_outcomes_dropped",
            "Outcomes the fast path dropped because its buffer was full.",
            registry=r,
        )
        self.fast_path_table_bytes = Gauge(
            "spillway_fast_path_table_bytes", "Size of the last decision table served.", registry=r
        )
        self.fast_path_table_left_out = Gauge(
            "spillway_fast_path_table_tenants_left_out",
            "Most tenant rows a node's last table went without, to fit the room its shared dict has.",
            registry=r,
        )
        self.fast_path_store_failed = Counter(
            "spillway_fast_path_table_store_failures",
            "Decision tables the plugin could not store in its shared dict (it kept the last one).",
            registry=r,
        )
        self.shared_connected = Gauge(
            "spillway_shared_state_connected",
            "1 while the shared store answers; 0: deciding alone with this node's share.",
            registry=r,
        )
        self.shared_rounds = Counter(
            "spillway_shared_state_rounds", "Rounds the shared store answered.", registry=r
        )
        self.shared_errors = Counter(
            "spillway_shared_state_errors", "Rounds the shared store failed or answered late.", registry=r
        )
        self.shared_alone = Gauge(
            "spillway_shared_state_alone_usd",
            "The most this node spends on a target in the window should the shared store go away now "
            "(its leases plus 1/N of what was left), as its last answered round left it.",
            ["target", "window"],
            registry=r,
        )
        self.latency_target = Gauge(
            "spillway_latency_target_seconds",
            "The latency target a model's local wait plus service time is held to (model * : the default).",
            ["model"],
            registry=r,
        )
        self.cap = Gauge(
            "spillway_target_concurrency_cap",
            "In-flight requests this runner may send a target (its share of a shared cap).",
            ["target"],
            registry=r,
        )
        self.budget = Gauge(
            "spillway_budget_usd", "A target's spend budget per window.", ["target", "window"], registry=r
        )
        self.spent = Gauge(
            "spillway_target_spent_usd",
            "Estimated spend of a target in the current wall-clock window, as its budget counts it.",
            ["target", "window"],
            registry=r,
        )
        self.cost = CostSeries(r, tenants=20, models=20)
        self.local_cost_rate = Gauge(
            "spillway_local_cost_usd_per_hour", "What the on-prem cluster costs an hour.", registry=r
        )
        self.local_gpus = Gauge("spillway_local_gpus", "GPUs serving the on-prem cluster.", registry=r)
        self.warmup_warm = Gauge(
            "spillway_warmup_warm_instances",
            "Distinct warm instances the warm-up's last round verified (from warmup.report_file).",
            ["target"],
            registry=r,
        )
        self.warmup_wanted = Gauge(
            "spillway_warmup_wanted_instances",
            "Instances the warm-up's last round was to keep warm (from warmup.report_file).",
            ["target"],
            registry=r,
        )
        self.warmup_round = Gauge(
            "spillway_warmup_last_round_timestamp_seconds",
            "When the warm-up's last round ended (from warmup.report_file).",
            registry=r,
        )

    def publish_limits(self, config: SpillwayConfig) -> None:
        """What dashboards draw the gauges against: latency targets and budgets; and every target's
        counters from zero, so a rate of them is 0 rather than no data until the first event."""
        for target in config.targets:
            self.cold_hits.labels(target.name)
            self.spend.labels(target.name)
        self.latency_target.labels("*").set(config.local.latency_target_ms / 1000)
        for model, ms in config.local.model_latency_targets_ms.items():
            self.latency_target.labels(model).set(ms / 1000)
        for window, budgets in (
            ("hour", config.budgets.per_target_hourly_usd),
            ("day", config.budgets.per_target_daily_usd),
        ):
            for name, usd in budgets.items():
                self.budget.labels(name, window).set(usd)

    def due(self, kind: str) -> bool:
        """Whether a log line of ``kind`` is due: at most once a minute each."""
        said = self._said.get(kind)
        if said is None:
            said = self._said[kind] = Sometimes()
        return said.due()

    def decided(self, target: str, reason: str, count: int = 1) -> None:
        key = (target, reason)
        child = self._decision_children.get(key)
        if child is None:
            child = self._decision_children[key] = self.decisions.labels(target, reason)
        child.inc(count)

    def serve(self, listen: str) -> bool:
        """Start ``/metrics``; a taken port is logged, not fatal: routing matters more than metrics."""
        host, _, port = listen.rpartition(":")
        try:
            start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
        except OSError as exc:
            logging.getLogger("spillway.metrics").error(
                "cannot serve metrics on %s: %s; another process holds it (APISIX's prometheus plugin "
                "exports on 127.0.0.1:9091 unless plugin_attr.prometheus.export_addr moves it): set "
                "metrics.listen to a free port",
                listen,
                exc,
            )
            return False
        return True
