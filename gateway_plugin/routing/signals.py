"""Load signals from the on-prem Tritons' Prometheus endpoints, turned into ``LocalLoad`` snapshots.

Triton's cumulative counters move on every scrape, so service and queue times per request come
from deltas between two scrapes; the pending count is an instantaneous sample. Between scrapes
the gateway counts what it sent local itself. A scrape that fails leaves the last sample in place
until it is older than ``stale_after_s``: then the snapshot says the signals are missing and the
policy keeps requests local.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gateway_plugin.routing.policy import LocalLoad

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


@dataclass(frozen=True)
class Counters:
    """One model's cumulative counters (summed over versions and endpoints) and its pending sample."""

    success: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0
    pending: float = 0.0

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.success + other.success,
            self.queue_us + other.queue_us,
            self.compute_us + other.compute_us,
            self.pending + other.pending,
        )


def parse_triton_metrics(text: str) -> dict[str, Counters]:
    """Per-model counters from Triton's Prometheus text, read with the Prometheus parser."""
    fields: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
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

    def read(self, now: float, count: int = 0) -> float:
        """The rate as of ``now``, ``count`` events added."""
        if now > self.at:
            self.rps *= math.exp((self.at - now) / RATE_S)
            self.at = now
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
    onprem: Rate = field(default_factory=Rate)

    def scraped(self, now: Counters, first: bool) -> None:
        done = now.success - self.counters.success
        if not first and done > 0:
            self.queue_ms = max(0.0, (now.queue_us - self.counters.queue_us) / done / 1000)
            self.compute_ms = max(0.0, (now.compute_us - self.counters.compute_us) / done / 1000)
        elif not first and done == 0 and not now.pending:
            self.queue_ms = 0.0
        self.pending = int(now.pending)
        self.sent = 0
        self.counters = now

    def view(self, fresh: bool, age_ms: float, now: float, stale_after_s: float, in_flight: int) -> LocalLoad:
        observed = self.observed_ms if now - self.observed_at <= stale_after_s else 0.0
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
        )


MAX_MODELS = 1000


@dataclass
class LoadTracker:
    """Owned by the runner's loop: scrapes update it, requests read and count into it.

    Models are the ones the cluster reports (and the config names); a request for any other name
    (a client picks the path) is counted under all models, so no client can grow this state.
    """

    stale_after_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    last_ok: float = float("-inf")
    _models: dict[str, _ModelLoad] = field(default_factory=lambda: {ALL_MODELS: _ModelLoad()})

    def declare(self, models: Iterable[str]) -> None:
        """Models the config names: tracked before the first scrape reports them."""
        for model in models:
            if len(self._models) < MAX_MODELS:
                self._models.setdefault(model, _ModelLoad())

    def observe(self, per_endpoint: Iterable[dict[str, Counters]]) -> None:
        """One complete scrape of every endpoint."""
        merged: dict[str, Counters] = defaultdict(Counters)
        for sample in per_endpoint:
            for model, counters in sample.items():
                merged[model] = merged[model] + counters
                merged[ALL_MODELS] = merged[ALL_MODELS] + counters
        first = self.last_ok == float("-inf")
        for model, now in merged.items():
            entry = self._models.get(model)
            if entry is None and len(self._models) < MAX_MODELS:
                entry = self._models[model] = _ModelLoad()
            if entry is not None:
                entry.scraped(now, first)
        self.last_ok = self.clock()

    def sent_local(self, model: str | None) -> None:
        entry = self._entry(model)
        entry.sent += 1
        overall = self._models[ALL_MODELS]
        if entry is not overall:
            overall.sent += 1

    def sent_local_many(self, model: str | None, count: int) -> None:
        """``count`` requests sent local at once (the fast path reports them in batches)."""
        if count <= 0:
            return
        entry = self._entry(model)
        entry.sent += count
        overall = self._models[ALL_MODELS]
        if entry is not overall:
            overall.sent += count

    def arrived_onprem(self, model: str | None, count: int = 1) -> None:
        """``count`` requests that may not leave arrived for ``model`` (the headroom's measure)."""
        if count > 0:
            now = self.clock()
            for entry in {id(e): e for e in (self._entry(model), self._entry(ALL_MODELS))}.values():
                entry.onprem.read(now, count)

    def answered_local(self, model: str | None, ms: float, weight: float = 0.2) -> None:
        """The gateway saw the cluster answer in ``ms``: a moving average, per model and overall."""
        now = self.clock()
        for entry in {id(e): e for e in (self._entry(model), self._entry(ALL_MODELS))}.values():
            fresh = now - entry.observed_at <= self.stale_after_s
            entry.observed_ms = entry.observed_ms + weight * (ms - entry.observed_ms) if fresh else ms
            entry.observed_at = now

    def known(self, model: str) -> bool:
        """Whether the cluster reports ``model`` or the config names it (not merely a client's path)."""
        return model != ALL_MODELS and model in self._models

    def set_overflowing(self, model: str | None, hot: bool) -> None:
        self._entry(model).overflowing = hot

    def _entry(self, model: str | None) -> _ModelLoad:
        return self._models.get(model or ALL_MODELS) or self._models[ALL_MODELS]

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
            name: self._models[name].view(fresh, age_ms, now, self.stale_after_s, in_flight)
            for name in names
            if name in self._models
        }


Fetch = Callable[[str], Awaitable[str]]


class Scraper:
    """Scrapes every endpoint each period; a failed round leaves the tracker to go stale.

    ``fetch`` is the I/O (an HTTP GET returning the body; it raises ``OSError``, ``TimeoutError``
    or ``ValueError`` on failure); ``on_failure`` counts a failed round.
    """

    def __init__(
        self,
        tracker: LoadTracker,
        fetch: Fetch,
        urls: list[str],
        period_s: float,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        self.tracker = tracker
        self.period_s = period_s
        self._fetch = fetch
        self._urls = urls
        self._on_failure = on_failure

    async def scrape_once(self) -> bool:
        try:
            texts = await asyncio.gather(*(self._fetch(url) for url in self._urls))
        except (OSError, TimeoutError, ValueError) as exc:
            self._on_failure()
            log.warning("metrics scrape failed: %s", exc)
            return False
        self.tracker.observe(parse_triton_metrics(text) for text in texts)
        return True

    async def run(self) -> None:
        while True:
            try:
                await self.scrape_once()
            except Exception:  # the loop must outlive any one bad round; the signals then go stale
                self._on_failure()
                log.exception("metrics scrape failed unexpectedly")
            await asyncio.sleep(self.period_s)
