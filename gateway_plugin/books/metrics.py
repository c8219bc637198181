"""The runner's Prometheus families (``spillway_*``), served on their own port."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from gateway_plugin.books.cost_series import CostSeries
from gateway_plugin.books.families import (
    FAMILIES_AFTER_COST,
    FAMILIES_BEFORE_COST,
    BucketCounts,
    Family,
    ReportedCounter,
)
from gateway_plugin.config import SpillwayConfig


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
    """The runner's families, each reached by the attribute its row in ``books.families`` names
    (declared here with its type, so callers are checked); ``cost``: the per-tenant and per-model
    series."""

    decisions: Counter
    residency_kept: Counter
    content_matches: Counter
    content_unscannable: Counter
    local_wait: Gauge
    overflowing: Gauge
    threshold_value: Gauge
    threshold_limit: Gauge
    local_failing: Gauge
    signals_fresh: Gauge
    scrape_errors: Counter
    local_members: Gauge
    local_capacity: Gauge
    spend: Counter
    breaker_open: Gauge
    in_flight: Gauge
    warm: Gauge
    cold_hits: Counter
    target_latency: Histogram
    invoke_failures: Counter
    outcome_fields_invalid: Counter
    fast_path_fail_safe: Counter
    fast_path_table_age: BucketCounts
    fast_path_dropped: Counter
    fast_path_table_bytes: Gauge
    fast_path_table_left_out: Gauge
    fast_path_store_failed: Counter
    shared_connected: Gauge
    shared_rounds: Counter
    shared_errors: Counter
    shared_alone: Gauge
    latency_target: Gauge
    cap: Gauge
    budget: Gauge
    spent: Gauge
    local_cost_rate: Gauge
    local_gpus: Gauge
    warmup_warm: Gauge
    warmup_wanted: Gauge
    warmup_spend: ReportedCounter
    warmup_round: Gauge
    cost: CostSeries

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._said: dict[str, Sometimes] = {}
        self._decision_children: dict[tuple[str, str], Counter] = {}
        self._spend_owed: dict[str, float] = {}
        self._build(FAMILIES_BEFORE_COST)
        self.cost = CostSeries(self.registry, tenants=20, models=20)
        self._build(FAMILIES_AFTER_COST)

    def _build(self, families: Sequence[Family]) -> None:
        for family in families:
            setattr(self, family.attr, family.build(self.registry))

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

    def spend_counted(self, target: str, usd: float) -> None:
        """``usd`` spent at ``target`` (a configured one); less than nothing, given back. The
        counter only grows, so what is given back is owed and taken off the spend that follows."""
        net = usd - self._spend_owed.get(target, 0.0)
        self._spend_owed[target] = max(0.0, -net)
        if net > 0:
            self.spend.labels(target).inc(net)

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
