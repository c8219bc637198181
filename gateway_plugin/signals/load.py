"""Load signals from the on-prem Tritons' Prometheus endpoints, turned into ``LocalLoad`` snapshots.

Triton's cumulative counters move on every scrape, so service and queue times per request come
from deltas between two scrapes; the pending count is an instantaneous sample. Between scrapes
the gateway counts what it sent local itself. A scrape that fails leaves the last sample in place
until it is older than ``stale_after_s``: then the snapshot says the signals are missing and the
policy keeps requests local.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.samples import Sample

from gateway_plugin.config import LocalHealth
from gateway_plugin.health.local_health import CLOSED, LocalBreaker
from gateway_plugin.policy.gauges import Gauges
from gateway_plugin.policy.overflow import gauges_hot
from gateway_plugin.policy.snapshot import LocalLoad, Threshold
from gateway_plugin.signals.exposition import samples_of
from gateway_plugin.signals.members import Counters, Members

log = logging.getLogger("spillway.signals")

ALL_MODELS = ""
# How fast the on-prem-only arrival rate follows the arrivals: an exponential average over about a
# second, so it rises within a burst's first second and falls once it is over.
RATE_S = 1.0
_COMPUTE = (
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def parse_triton_metrics(text: str) -> dict[str, Counters]:
    """Per-model counters from Triton's Prometheus text."""
    return counters_of(samples_of(text))


def counters_of(samples: Iterable[Sample]) -> dict[str, Counters]:
    """Per-model counters, summed over versions."""
    fields: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for sample in samples:
        model = sample.labels.get("model")
        if model is None:
            continue
        name = sample.name.removesuffix("_total")
        if name == "nv_inference_request_success":
            fields[model]["success"] += sample.value
        elif name == "nv_inference_queue_duration_us":
            fields[model]["queue_us"] += sample.value
        elif name in _COMPUTE:
            fields[model]["compute_us"] += sample.value
        elif name == "nv_inference_pending_request_count":
            fields[model]["pending"] += sample.value
    return {model: Counters(**values) for model, values in fields.items()}


@dataclass
class Rate:
    """Events per second, an exponential average over about ``RATE_S``."""

    rps: float = 0.0
    at: float = 0.0

    def read(self, now: float, count: int = 0, span_s: float = 0.0) -> float:
        """The rate as of ``now``, ``count`` events added: spread evenly over the last ``span_s``
        (each as decayed since it came), or all at ``now``."""
        if now > self.at:
            self.rps *= math.exp((self.at - now) / RATE_S)
            self.at = now
        if span_s > 0:
            self.rps += count / span_s * -math.expm1(-span_s / RATE_S)
        else:
            self.rps += count / RATE_S
        return self.rps


@dataclass
class _ModelLoad:
    """Mutable per-model state; requests read it through immutable ``LocalLoad`` snapshots."""

    counters: Counters = field(default_factory=Counters)
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    pending: int = 0
    sent: int = 0
    overflowing: bool = False
    observed_ms: float = 0.0
    observed_at: float = float("-inf")
    first_token_late: bool = False
    onprem: Rate = field(default_factory=Rate)
    health: LocalBreaker = field(default_factory=LocalBreaker)

    def scraped(self, done: Counters | None, pending: float) -> None:
        """A round's work since the last (None: no member was seen in both) and what is pending now."""
        if done is not None and done.success > 0:
            self.queue_ms = max(0.0, done.queue_us / done.success / 1000)
            self.compute_ms = max(0.0, done.compute_us / done.success / 1000)
        elif done is not None and not pending:
            self.queue_ms = 0.0
        self.pending = int(pending)
        self.sent = 0

    def view(
        self, fresh: bool, age_ms: float, now: float, tracker: LoadTracker, in_flight: int, capacity: float
    ) -> LocalLoad:
        observed_fresh = now - self.observed_at <= tracker.stale_after_s
        observed = self.observed_ms if observed_fresh else 0.0
        settings, refused = tracker.health, tracker.refused
        return LocalLoad(
            fresh,
            self.queue_ms,
            self.compute_ms,
            self.pending,
            self.sent,
            age_ms,
            self.overflowing,
            observed,
            in_flight,
            self.onprem.read(now),
            tracker.gauges_hot or (observed_fresh and self.first_token_late),
            self.health.current(settings, now, refused) is not CLOSED,
            self.health.probe_allowed(settings, now, refused),
            capacity,
        )


MAX_MODELS = 1000
DROP_AFTER_S = 1.0


def _sum(counters: Iterable[Counters]) -> Counters:
    total = Counters()
    for each in counters:
        total = total + each
    return total


@dataclass
class LoadTracker:
    """Owned by the runner's loop: scrapes update it, requests read and count into it.

    Models are the ones the cluster reports (and the config names); a request for any other name
    (a client picks the path) is counted under all models, so no client can grow this state.
    """

    stale_after_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    last_ok: float = float("-inf")
    # When a scrape last read the cluster's pending requests (what was sent before, it saw).
    scraped_at: float = float("-inf")
    # local.thresholds' limits, the cluster's value of each gauge at the last scrape (in their
    # order) and their hysteresis state.
    thresholds: tuple[Threshold, ...] = ()
    gauges: Gauges = ()
    gauges_hot: bool = False
    # local.model_ttft_targets_ms, and overflow's (enter, exit) ratios of a target.
    ttft_targets_ms: Mapping[str, float] = field(default_factory=dict)
    ttft_ratios: tuple[float, float] = (1.0, 1.0)
    health: LocalHealth = field(default_factory=LocalHealth)
    # Whether the last scrape found a metrics endpoint refusing connections (the host is down).
    refused: bool = False
    # What the cluster runs at once with every member answering, what one member does (0: an
    # even share of the former; or each member's own model configuration says), how many members
    # count now, and their books.
    parallelism: float = 1.0
    member_parallelism: float = 0.0
    from_model_config: bool = False
    live: int = 0
    members: Members = field(default_factory=lambda: Members(DROP_AFTER_S))
    _models: dict[str, _ModelLoad] = field(default_factory=lambda: {ALL_MODELS: _ModelLoad()})

    def declare(self, models: Iterable[str]) -> None:
        """Models the config names: tracked before the first scrape reports them."""
        for model in models:
            if len(self._models) < MAX_MODELS:
                self._models.setdefault(model, _ModelLoad())

    def observe(self, per_endpoint: Iterable[dict[str, Counters]], gauged: Gauges = ()) -> None:
        """A round in which every endpoint answered (the simulator's)."""
        self.round({str(i): counters for i, counters in enumerate(per_endpoint)}, gauged)

    def round(self, answers: Mapping[str, dict[str, Counters] | BaseException], gauged: Gauges = ()) -> bool:
        """One scrape round: each member's counters, or why it failed, and the gauges over those
        that answered. The load is read over the members that count; False (and nothing read)
        when none answered, so the signals go stale."""
        now = self.clock()
        sums = self.members.round(answers, now)
        self.live = sums.live
        if not sums.answered:
            return False
        self.gauges = gauged
        self.gauges_hot = gauges_hot(gauged, self.thresholds, self.gauges_hot)
        for model in sums.pending.keys() | sums.delta.keys():
            if model not in self._models and len(self._models) < MAX_MODELS:
                self._models[model] = _ModelLoad()
            entry = self._models.get(model)
            if entry is not None:
                entry.scraped(sums.delta.get(model), sums.pending.get(model, 0.0))
        overall = _sum(sums.delta.values()) if sums.delta else None
        self._models[ALL_MODELS].scraped(overall, sum(sums.pending.values()))
        self.last_ok = self.scraped_at = now
        return True

    def unchanged(self) -> None:
        """A round whose source had nothing new (the same samples as the last): still fresh."""
        self.last_ok = self.clock()

    @property
    def capacity(self) -> float:
        """Requests the members that count run at once (every model's)."""
        return self.capacity_of(ALL_MODELS)

    def capacity_of(self, model: str) -> float:
        """Requests of ``model`` the members that count run at once."""
        if self.from_model_config:
            return self.members.instances(model)
        if self.member_parallelism:
            return self.live * self.member_parallelism
        known = self.members.known
        return self.parallelism * self.live / known if known else self.parallelism

    def sent_local(self, model: str | None) -> None:
        entry = self._entry(model)
        entry.sent += 1
        overall = self._models[ALL_MODELS]
        if entry is not overall:
            overall.sent += 1

    def sent_local_many(self, model: str | None, count: int, span_s: float = 0.0) -> None:
        """``count`` requests sent local over the last ``span_s`` (the fast path reports them in
        batches): the share sent since the last scrape, taking them as spread evenly, since the
        scrape saw the rest pending or done; all of them where ``span_s`` is 0."""
        if span_s > 0:
            count = round(count * min(1.0, (self.clock() - self.scraped_at) / span_s))
        if count <= 0:
            return
        for entry in self._both(model):
            entry.sent += count

    def arrived_onprem(self, model: str | None, count: int = 1, span_s: float = 0.0) -> None:
        """``count`` requests that may not leave arrived for ``model`` over the last ``span_s``
        (the headroom's measure)."""
        if count > 0:
            now = self.clock()
            for entry in self._both(model):
                entry.onprem.read(now, count, span_s)

    def answered_local(self, model: str | None, ms: float, weight: float = 0.2) -> None:
        """The gateway saw the cluster's answer start after ``ms``: a moving average, per model and
        overall. A model with a first-token target is late once the average passes its share of
        the target that starts overflow, and stays late until it falls below the share that ends
        it (the latency's hysteresis); the thresholds' verdict carries it to both routes."""
        now = self.clock()
        both = self._both(model)
        own = both[0]
        was_late = own.first_token_late and now - own.observed_at <= self.stale_after_s
        for entry in both:
            fresh = now - entry.observed_at <= self.stale_after_s
            entry.observed_ms = entry.observed_ms + weight * (ms - entry.observed_ms) if fresh else ms
            entry.observed_at = now
        target = self.ttft_targets_ms.get(model or ALL_MODELS)
        if target is not None:
            enter, leave = self.ttft_ratios
            own.first_token_late = own.observed_ms > target * (leave if was_late else enter)

    def local_answer(self, model: str | None, ok: bool) -> None:
        """The cluster answered a request (``ok``: not 5xx, not timed out or refused): its
        breakers, the model's and every model's, learn of it."""
        now = self.clock()
        for entry in self._both(model):
            entry.health.record(self.health, ok, now, self.refused)

    def dispatched_local(self, model: str | None) -> None:
        """A request went local: a probe where the cluster's breaker is half-open."""
        now = self.clock()
        for entry in self._both(model):
            entry.health.dispatched(self.health, now, self.refused)

    def known(self, model: str) -> bool:
        """Whether the cluster reports ``model`` or the config names it (not merely a client's path)."""
        return model != ALL_MODELS and model in self._models

    def set_overflowing(self, model: str | None, hot: bool) -> None:
        self._entry(model).overflowing = hot

    def _entry(self, model: str | None) -> _ModelLoad:
        return self._models.get(model or ALL_MODELS) or self._models[ALL_MODELS]

    def _both(self, model: str | None) -> tuple[_ModelLoad, ...]:
        """The model's entry, then every model's: one entry where they are one."""
        own, overall = self._entry(model), self._models[ALL_MODELS]
        return (own,) if own is overall else (own, overall)

    def __len__(self) -> int:
        return len(self._models)

    @property
    def fresh(self) -> bool:
        return self.clock() - self.last_ok <= self.stale_after_s

    def snapshot(self, model: str | None = None, in_flight: int = -1) -> dict[str, LocalLoad]:
        """The named model's load and the all-models load (every model's when ``model`` is None).

        ``in_flight``: the requests the gateway has at the cluster, as it counts them (the edge
        plugin on the ext-plugin route, the simulator), given to the loads returned; -1: none."""
        now = self.clock()
        age_s = now - self.last_ok
        fresh = age_s <= self.stale_after_s
        age_ms = age_s * 1000 if fresh else 0.0
        names = list(self._models) if model is None else [model, ALL_MODELS]
        return {
            name: self._models[name].view(fresh, age_ms, now, self, in_flight, self.capacity_of(name))
            for name in names
            if name in self._models
        }
