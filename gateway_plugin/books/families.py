"""The runner's Prometheus families (``spillway_*``) declared as data: what each exposes, and the
attribute of ``RunnerMetrics`` that reaches it. Dashboards, alerts, recording rules and the bill
read these names, help texts and labels; ``tests/unit/test_runner_metrics.py`` holds them line for line."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

# Upper bounds (seconds) of the fast path's table-age buckets, as apisix/plugins/spillway/report.lua.
TABLE_AGE_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class BucketCounts(Collector):
    """A histogram whose observations arrive already counted per bucket (the fast path's workers
    sum them up), so that thousands of them cost one addition per bucket. Made as
    prometheus_client's own are (``registry`` registers it), without labels."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        if labelnames:
            raise ValueError(f"{name}: counts per bucket take no labels, got {list(labelnames)}")
        self.name, self.documentation, self.bounds = name, documentation, tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        if registry is not None:
            registry.register(self)

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


class ReportedCounter(Collector):
    """A counter another process keeps (the warm-up's, in its report file), shown at the values it
    reported, each set of labels' value replaced as a whole at every reading: one that went down
    is a reset, as Prometheus reads it; a set no longer reported is no longer shown. No samples
    before the first reading, so a runner that starts never shows a false jump from zero."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}
        if registry is not None:
            registry.register(self)

    def replace(self, values: dict[tuple[str, ...], float]) -> None:
        """Every set of labels' value as the other process last reported them."""
        for labels in values:
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name}: labels {list(labels)} for {list(self.labelnames)}")
        self.values = dict(values)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in sorted(self.values.items()):
            family.add_metric(labels, value)
        yield family


class Family(NamedTuple):
    """One family: the attribute that reaches it, its kind, name, help, labels and (a histogram's)
    buckets (None: the kind's own)."""

    attr: str
    kind: Callable[..., Collector]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    def build(self, registry: CollectorRegistry) -> Collector:
        """The family, registered in ``registry``."""
        if self.buckets is None:
            return self.kind(self.name, self.help, self.labels, registry=registry)
        return self.kind(self.name, self.help, self.labels, registry=registry, buckets=self.buckets)


# In the order they are registered, which is the order /metrics lists them; the per-tenant cost
# series (``cost_series.CostSeries``) register between these two tables.
FAMILIES_BEFORE_COST = (
    # What each request was decided.
    Family(
        "decisions",
        Counter,
        "spillway_decisions",
        "Routing decisions, by target and reason.",
        ("target", "reason"),
    ),
    Family(
        "residency_kept",
        Counter,
        "spillway_residency_kept",
        "Requests a rule would have sent out but residency kept on premises.",
    ),
    Family(
        "content_matches",
        Counter,
        "spillway_content_matches",
        "Requests that would have left and whose text a content detector matched (the first that "
        "did, in order): kept on premises.",
        ("detector",),
    ),
    Family(
        "content_unscannable",
        Counter,
        "spillway_content_unscannable",
        "Requests that would have left and whose text could not be read (too_large, unknown_size, "
        "not_json, binary_text, trailing_bytes; content.unscannable says whether they stayed) or "
        "whose scan ran past content.scan_budget_ms (over_budget: they stayed).",
        ("reason",),
    ),
    # The on-prem cluster as the scrapes find it.
    Family(
        "local_wait",
        Gauge,
        "spillway_local_wait_seconds",
        "Estimated wait of a new request on the cluster.",
        ("model",),
    ),
    Family("overflowing", Gauge, "spillway_overflowing", "1 while a model spills to the cloud.", ("model",)),
    Family(
        "threshold_value",
        Gauge,
        "spillway_local_threshold_value",
        "The cluster's value of a local.thresholds gauge at the last scrape (NaN: not reported).",
        ("threshold",),
    ),
    Family(
        "threshold_limit",
        Gauge,
        "spillway_local_threshold_limit",
        "The limit past which that gauge makes the cluster overflow.",
        ("threshold",),
    ),
    Family(
        "local_failing",
        Gauge,
        "spillway_local_failing",
        "1 while the cluster's own answers fail for a model (its breaker open or probing): "
        "requests that may leave go out, on-prem-only ones get 503.",
        ("model",),
    ),
    Family(
        "signals_fresh",
        Gauge,
        "spillway_signals_fresh",
        "1 while Triton's metrics are fresh; 0 keeps everything local.",
    ),
    Family(
        "scrape_errors",
        Counter,
        "spillway_signal_scrape_errors",
        "Rounds of metrics scraping in which no member answered.",
    ),
    Family(
        "local_members",
        Gauge,
        "spillway_local_members",
        "On-prem members by state (up, failing, down, wedged: metrics answer, inference fails).",
        ("state",),
    ),
    Family(
        "local_capacity",
        Gauge,
        "spillway_local_capacity",
        "Requests of a model the on-prem members that count run at once (the policy's capacity; "
        "model * is every model's).",
        ("model",),
    ),
    # The cloud targets.
    Family("spend", Counter, "spillway_cloud_spend_usd", "Estimated cloud spend.", ("target",)),
    Family(
        "breaker_open",
        Gauge,
        "spillway_breaker_open",
        "1 while a target's breaker is open or half-open.",
        ("target",),
    ),
    Family("in_flight", Gauge, "spillway_target_in_flight", "Requests in flight per target.", ("target",)),
    Family("warm", Gauge, "spillway_warm_instances", "Instances seen warm within the idle TTL.", ("target",)),
    Family("cold_hits", Counter, "spillway_cold_hits", "Requests answered by a cold instance.", ("target",)),
    Family(
        "target_latency",
        Histogram,
        "spillway_target_latency_seconds",
        "Invoke-mode latency per target.",
        ("target",),
    ),
    Family(
        "invoke_failures", Counter, "spillway_invoke_failures", "Failed invocations per target.", ("target",)
    ),
    Family(
        "outcome_fields_invalid",
        Counter,
        "spillway_outcome_fields_invalid",
        "Outcome fields that were malformed (a client's header too long, bytes not UTF-8) and read "
        "as absent; the rest of each entry was taken.",
        ("field",),
    ),
    # The fast path.
    Family(
        "fast_path_fail_safe",
        Counter,
        "spillway_fast_path_fail_safe",
        "Fast-path decisions made without a usable table (stale, missing or malformed): local or shed.",
    ),
    Family(
        "fast_path_table_age",
        BucketCounts,
        "spillway_fast_path_table_age_seconds",
        "Age of the decision table each fast-path decision was made from.",
        buckets=TABLE_AGE_BOUNDS,
    ),
    Family(
        "fast_path_dropped",
        Counter,
        "spillway_fast_path_outcomes_dropped",
        "Outcomes the fast path dropped because its buffer was full.",
    ),
    Family(
        "fast_path_table_bytes",
        Gauge,
        "spillway_fast_path_table_bytes",
        "Size of the last decision table served.",
    ),
    Family(
        "fast_path_table_left_out",
        Gauge,
        "spillway_fast_path_table_tenants_left_out",
        "Most tenant rows a node's last table went without, to fit the room its shared dict has.",
    ),
    Family(
        "fast_path_store_failed",
        Counter,
        "spillway_fast_path_table_store_failures",
        "Decision tables the plugin could not store in its shared dict (it kept the last one).",
    ),
    # The state several gateways share.
    Family(
        "shared_connected",
        Gauge,
        "spillway_shared_state_connected",
        "1 while the shared store answers; 0: deciding alone with this node's share.",
    ),
    Family("shared_rounds", Counter, "spillway_shared_state_rounds", "Rounds the shared store answered."),
    Family(
        "shared_errors",
        Counter,
        "spillway_shared_state_errors",
        "Rounds the shared store failed or answered late.",
    ),
    Family(
        "shared_alone",
        Gauge,
        "spillway_shared_state_alone_usd",
        "The most this node spends on a target in the window should the shared store go away now "
        "(its leases plus 1/N of what was left), as its last answered round left it.",
        ("target", "window"),
    ),
    # What dashboards draw the gauges against (publish_limits).
    Family(
        "latency_target",
        Gauge,
        "spillway_latency_target_seconds",
        "The latency target a model's local wait plus service time is held to (model * : the default).",
        ("model",),
    ),
    Family(
        "cap",
        Gauge,
        "spillway_target_concurrency_cap",
        "In-flight requests this runner may send a target (its share of a shared cap).",
        ("target",),
    ),
    Family(
        "budget", Gauge, "spillway_budget_usd", "A target's spend budget per window.", ("target", "window")
    ),
    Family(
        "spent",
        Gauge,
        "spillway_target_spent_usd",
        "Estimated spend of a target in the current wall-clock window, as its budget counts it.",
        ("target", "window"),
    ),
)
FAMILIES_AFTER_COST = (
    # What the on-prem cluster costs.
    Family(
        "local_cost_rate",
        Gauge,
        "spillway_local_cost_usd_per_hour",
        "What the on-prem cluster costs an hour.",
    ),
    Family("local_gpus", Gauge, "spillway_local_gpus", "GPUs serving the on-prem cluster."),
    # The warm-up's last round, from its report file.
    Family(
        "warmup_warm",
        Gauge,
        "spillway_warmup_warm_instances",
        "Distinct warm instances the warm-up's last round verified (from warmup.report_file).",
        ("target",),
    ),
    Family(
        "warmup_wanted",
        Gauge,
        "spillway_warmup_wanted_instances",
        "Instances the warm-up's last round was to keep warm (from warmup.report_file).",
        ("target",),
    ),
    Family(
        "warmup_spend",
        ReportedCounter,
        "spillway_warmup_spend_usd",
        "Estimated spend of the warm-up's pings, as its report counts them across rounds (from "
        "warmup.report_file; not pings sent by cloud schedulers). Every runner and worker shows the "
        "same counter: take it once per target (max by (target)), never summed.",
        ("target",),
    ),
    Family(
        "warmup_round",
        Gauge,
        "spillway_warmup_last_round_timestamp_seconds",
        "When the warm-up's last round ended (from warmup.report_file).",
    ),
)
