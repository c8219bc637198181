"""``GatewayState``'s writes of outcomes other processes report, most of them summed: what the
fast path's plugin says (a worker's summary of its answers, a node's cumulative counters) rather
than one answer at a time, and what the warm-up's rounds reached. Part of ``GatewayState`` (its
base class), in a module of its own for length: the books stay written only by the state,
whichever path decided.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from functions.contract import PROVISIONED_METRIC, WARMUP_SPEND_METRIC
from gateway_plugin.books.ledger import HeldPrices, Ledger, TenantBooks
from gateway_plugin.books.metrics import RunnerMetrics
from gateway_plugin.books.warm_instances import WarmPool
from gateway_plugin.config import SpillwayConfig, Target
from gateway_plugin.costs import answer_cost_usd, request_cost_usd
from gateway_plugin.health.breakers import Breaker
from gateway_plugin.policy.model import Policy, Reason
from gateway_plugin.policy.snapshot import BreakerState
from gateway_plugin.shared.view import SharedView
from gateway_plugin.signals.load import LoadTracker

residency_log = logging.getLogger("spillway.residency")
# The most instances one summary may say a target's answers came from.
MAX_INSTANCES = 64


def interleaved(ok: int, failed: int, records: int) -> Iterator[bool]:
    """``records`` answers with ok and failed spread evenly in their proportion (a worker's sums
    say how many, not in what order): scattered failures never become a run of them."""
    total = ok + failed
    if total == 0:
        return
    failures = round(failed * records / total)
    if failed and not failures:
        failures = 1
    for i in range(records):
        yield (i + 1) * failures // records == i * failures // records


class SummedOutcomes:
    """The books a summary feeds; every method takes counts already checked against the config."""

    clock: Callable[[], float]
    wall: Callable[[], float]
    metrics: RunnerMetrics
    load: LoadTracker
    ledger: Ledger
    tenants: TenantBooks
    targets: dict[str, Target]
    breakers: dict[str, Breaker]
    pools: dict[str, WarmPool]
    held: dict[str, HeldPrices]
    shared: SharedView | None
    policy: Policy
    config: SpillwayConfig

    def warm_counts(self, counts: dict[str, dict[str, float]], ended: float | None) -> None:
        """The warm-up's last round as it reported it: verified warm and wanted, and the spend of
        every round's pings, per known target."""
        m = self.metrics
        for family, gauge in (
            ("spillway_warmup_warm_instances", m.warmup_warm),
            ("spillway_warmup_wanted_instances", m.warmup_wanted),
        ):
            for target, value in counts.get(family, {}).items():
                if target in self.targets:
                    gauge.labels(target).set(value)
        provisioned = counts.get(PROVISIONED_METRIC, {})
        for target, pool in self.pools.items():
            held = provisioned.get(target, 0.0)
            pool.provisioned = int(min(max(held, 0.0), pool.max_instances)) if math.isfinite(held) else 0
        spent = counts.get(f"{WARMUP_SPEND_METRIC}_total", {})
        m.warmup_spend.replace({(t,): usd for t, usd in spent.items() if t in self.targets})
        if ended is not None:
            m.warmup_round.set(ended)

    def warm_report(self, target: str, instances: list[str]) -> None:
        """Instances a warm-up ping reached count as warm from now."""
        now = self.clock()
        pool = self.pools.get(target)
        if pool is not None:
            for instance in instances:
                pool.seen(instance, now)
                if self.shared is not None:
                    self.shared.instance_seen(target, instance, self.wall())

    def answered_local(self, model: str | None, ms: float) -> None:
        """The cluster answered a request in ``ms``, as the gateway saw it."""
        self.load.answered_local(model, ms)

    def decided_elsewhere(self, target: str, label: str, count: int) -> None:
        """``count`` decisions another process made (its metrics, residency's kept count)."""
        self.metrics.decided(target, label, count)
        if label.startswith(Reason.RESIDENCY):
            self.metrics.residency_kept.inc(count)

    def used(self, tenant: str | None, model: str | None, target: str, count: int, usd: float) -> None:
        self.metrics.cost.counted(tenant, model, target, count, usd)

    def kept_home(self, seen: dict[str, object]) -> None:
        """A request residency kept home, as the residency log says it."""
        residency_log.info(json.dumps(seen))

    def sent_local(self, model: str | None, sent: int, span_s: float = 0.0) -> None:
        """Requests another process sent to the cluster over the last ``span_s``."""
        self.load.sent_local_many(model, sent, span_s)

    def arrived_onprem(self, model: str | None, arrived: int, span_s: float = 0.0) -> None:
        """Requests that may not leave, arrived at another process over the last ``span_s``."""
        self.load.arrived_onprem(model, arrived, span_s)

    def local_answers(self, model: str | None, ok: int, failed: int) -> None:
        """The cluster's answers, ok and failed, feeding its own health as the last ``window``."""
        health = self.config.local.health
        records = min(ok + failed, max(health.window, health.failures_to_open) + 1)
        for result in interleaved(ok, failed, records):
            self.load.local_answer(model, result)

    def member_answers(self, address: str, ok: int, failed: int, trailing: int) -> None:
        """One member's answers (APISIX's ``host:port`` of the node), ``trailing`` of them failed
        after its last ok one: a wedged member's failures."""
        self.load.members.answered(address, ok, failed, trailing)

    def cluster_answered(
        self, model: str | None, ok: bool, seconds: float | None, members: Iterable[tuple[str, bool]] = ()
    ) -> None:
        """The cluster's answer to a request the route sent there: its health, its time to the
        first byte, and each member's that APISIX tried (address, whether it answered)."""
        self.load.local_answer(model, ok=ok)
        for address, answered in members:
            self.member_answers(address, int(answered), int(not answered), int(not answered))
        if seconds is not None:
            self.answered_local(model, seconds * 1000)

    def outcome_field_invalid(self, name: str) -> None:
        self.metrics.outcome_fields_invalid.labels(name).inc()

    def stream_settled(
        self,
        target: str,
        tenant: str | None,
        model: str | None,
        seconds: float | None,
        tokens: float | None,
        cold: bool = False,
        prompt_tokens: float | None = None,
    ) -> None:
        """A stream of generated tokens sent to ``target`` ended (or was cut) after ``seconds``,
        having sent ``tokens`` for a prompt of ``prompt_tokens`` (the expected ones where either is
        unknown): its bill takes the place of the price held at decision in the budgets, and is
        counted in the spend metrics now. A shared budget takes what it cost beyond that price; what
        it cost less stays taken there until the window rolls (a lease is never handed back
        mid-window)."""
        spec = self.targets.get(target)
        if spec is None:
            return
        cost = spec.cost
        wall = self.wall()
        held = self.held[target].take(self.clock(), tenant)
        price = request_cost_usd(cost, cold, spec.cold_start_ms) if held is None else held.usd
        if tokens is None:
            tokens = cost.expected_output_tokens
        usd = price if seconds is None else answer_cost_usd(cost, seconds, tokens, prompt_tokens)
        more = usd - price
        if held is None:  # held before this process started, or past the bounds: in no window known
            more = max(0.0, more)
        held_at = None if held is None else held.wall
        self.ledger.spend(f"target:{target}", more, wall, held_at)
        book = self.tenants.get(tenant) if tenant else None
        if book is not None:
            book.add_spend(more, wall, held_at)
        if self.shared is not None and more > 0:
            self.shared.spent_elsewhere(target, more, wall)
            if tenant and book is not None:
                self.shared.tenant_reported(tenant, 0, more, wall)
        self.metrics.spend.labels(target).inc(usd)
        self.metrics.cost.add(tenant, model, target, 0, usd, usd)

    def cloud_answers(self, name: str, ok: int, failed: int) -> None:
        """A target's answers, ok and failed; only the last ``window`` (and a run of
        ``consecutive_failures``) move its breaker."""
        breaker = self.breakers.get(name)
        if breaker is None:
            return
        now = self.clock()
        if breaker.current(now) is BreakerState.HALF_OPEN and ok + failed:
            # Which answer was the probe is not known: it closes only a batch without failures.
            breaker.record(failed == 0, now)
            ok, failed = (ok - 1, failed) if failed == 0 else (ok, failed - 1)
        settings = self.config.breaker
        records = min(ok + failed, max(settings.window, settings.consecutive_failures) + 1)
        for result in interleaved(ok, failed, records):
            breaker.record(result, now)

    def instances_answered(self, name: str, instances: Mapping[str, bool]) -> None:
        """The instances a target's answers came from, each cold or not."""
        pool = self.pools.get(name)
        if pool is None:
            return
        now = self.clock()
        for instance, cold in list(instances.items())[:MAX_INSTANCES]:
            pool.seen(instance, now, cold)
            if cold:
                self.metrics.cold_hits.labels(name).inc()

    def tenant_counts(self, tenant: str, arrivals: int, spend: float) -> None:
        """A quota'd tenant's arrivals and spend elsewhere, less than nothing where streams settled
        below their price (a shared budget keeps that until its window rolls); a tenant without
        limits keeps no book."""
        quota = self.policy.quota_of(tenant)
        if not quota.limits_anything:
            return
        wall = self.wall()
        book = self.tenants.book(tenant)
        if quota.requests_per_minute is not None:
            book.arrivals.extend([wall] * min(arrivals, quota.requests_per_minute))
        book.add_spend(spend, wall)
        if self.shared is not None:
            self.shared.tenant_reported(tenant, arrivals, spend, wall)

    def spent_elsewhere(self, target: str, usd: float) -> None:
        """What another node's plugin spent at ``target`` since it last said: less than nothing
        where streams it settled cost less than their price, which the budget gets back (a shared
        one keeps it until the window rolls; the spend counter, which only grows, owes it)."""
        wall = self.wall()
        self.ledger.spend(f"target:{target}", usd, wall)
        if self.shared is not None:
            self.shared.spent_elsewhere(target, usd, wall)
        self.metrics.spend_counted(target, usd)

    def overflow_decided(self, model: str | None, hot: bool) -> None:
        """The overflow flag a node last decided for ``model``."""
        self.load.set_overflowing(model, hot)

    def content_matched(self, detector: str, count: float) -> None:
        """Requests another process's content checks kept home, by the detector that matched."""
        self.metrics.content_matches.labels(detector).inc(count)

    def content_unscannable(self, reason: str, count: float) -> None:
        """Requests another process's content checks could not read, by why."""
        self.metrics.content_unscannable.labels(reason).inc(count)

    def fast_path_counted(
        self,
        fail_safe: float = 0.0,
        dropped: float = 0.0,
        store_failed: float = 0.0,
        table_ages: Sequence[int] | None = None,
        table_age_sum: float = 0.0,
    ) -> None:
        """The fast path's own counters: fail-safe decisions, outcomes it dropped, tables it could
        not store, and the table's age at each decision."""
        m = self.metrics
        m.fast_path_fail_safe.inc(fail_safe)
        m.fast_path_dropped.inc(dropped)
        m.fast_path_store_failed.inc(store_failed)
        if table_ages is not None:
            m.fast_path_table_age.add(table_ages, table_age_sum)
