"""Breakers, retry budget, spend ledger and warm pools: the state the policy's snapshots come from;
and what the policy does with budgets, spend quotas and half-open breakers."""

from __future__ import annotations

import math
from typing import Any

from gateway_plugin.books.ledger import Ledger, Outstanding, TenantBooks
from gateway_plugin.books.warm_instances import WarmPool
from gateway_plugin.config import BreakerSettings, SpillwayConfig
from gateway_plugin.health.breakers import CLOSED, HALF_OPEN, OPEN, Breaker, RetryBudget
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.model import LOCAL, SHED, Policy
from gateway_plugin.policy.snapshot import (
    BreakerState,
    LocalLoad,
    RequestFeatures,
    Snapshot,
    TargetState,
    TenantState,
)

SETTINGS = BreakerSettings(
    consecutive_failures=3, failure_rate=0.5, window=4, cooldown_s=5, max_cooldown_s=18
)


def test_consecutive_failures_open_then_cooldown_then_probe_closes() -> None:
    b = Breaker(SETTINGS)
    for t in range(3):
        b.record(False, t)
    assert b.current(3) == OPEN
    assert b.current(6.9) == OPEN, "opened at the third failure (t=2) for 5 s"
    assert b.current(7) == HALF_OPEN
    assert b.probe_allowed(8)
    b.dispatched(8)
    assert not b.probe_allowed(8), "one probe at a time"
    b.record(True, 9)
    assert b.current(9) == CLOSED


def test_failed_probe_reopens_with_a_doubled_cooldown_up_to_the_ceiling() -> None:
    b = Breaker(SETTINGS)
    for t in range(3):
        b.record(False, t)
    now, cooldowns = 2.0, []
    for _ in range(4):
        cooldowns.append(b.cooldown_s)
        now += b.cooldown_s
        assert b.current(now) == HALF_OPEN
        b.dispatched(now)
        b.record(False, now)
    assert cooldowns == [5, 10, 18, 18]


def test_failure_rate_over_the_window_opens() -> None:
    b = Breaker(SETTINGS)
    for t, ok in enumerate([True, False, True, False]):
        b.record(ok, t)
    assert b.current(4) == OPEN


def test_successes_keep_it_closed() -> None:
    b = Breaker(SETTINGS)
    for t in range(50):
        b.record(t % 5 != 0, t)
    assert b.current(50) == CLOSED


def test_retry_budget_is_a_share_of_requests() -> None:
    budget = RetryBudget(0.2, window=10)
    for _ in range(10):
        budget.request(False)
    assert budget.allows_retry()
    budget.request(True)
    budget.request(True)
    assert not budget.allows_retry()
    assert not RetryBudget(0.0).allows_retry()


def test_spend_rolls_over_by_the_hour_and_day() -> None:
    ledger = Ledger()
    ledger.spend("target:aws", 1.0, 3600 * 5 + 10)
    ledger.spend("target:aws", 2.0, 3600 * 5 + 20)
    assert ledger.spent("target:aws", 3600 * 5 + 30) == (3.0, 3.0)
    assert ledger.spent("target:aws", 3600 * 6 + 1) == (0.0, 3.0)
    assert ledger.spent("target:aws", 86400 * 2) == (0.0, 0.0)


def test_rate_window_and_expiring_in_flight() -> None:
    book = TenantBooks(in_flight_ttl_s=10).book("t")
    book.arrivals.extend((0, 30, 59))
    assert book.last_minute(59.5) == 3 and book.last_minute(60.5) == 2
    book.in_flight.add(0)
    book.in_flight.add(5)
    assert book.in_flight.count(6) == 2
    book.in_flight.done()
    assert book.in_flight.count(6) == 1
    assert book.in_flight.count(16) == 0, "an answer never seen does not leak forever"
    out = Outstanding(1.0)
    out.done()
    assert out.count(0) == 0


def test_tenant_books_are_capped_and_forget_the_least_recently_seen() -> None:
    books = TenantBooks(max_tenants=3)
    for tenant in ("a", "b", "c"):
        books.book(tenant).add_spend(1.0, 0)
    books.book("a")
    books.book("d")
    assert len(books) == 3
    assert books.get("b") is None, "b was seen least recently"
    a = books.get("a")
    assert a is not None and a.spent(0) == (1.0, 1.0)


def test_warm_pool_is_capped_and_keeps_the_most_recently_seen() -> None:
    pool = WarmPool(idle_ttl_s=300, max_instances=2)
    for i, instance in enumerate(("a", "b", "a", "c")):
        pool.seen(instance, i)
    assert pool.warm(10) == 2
    pool.seen("b", 400)
    assert pool.warm(400) == 1, "a and c idle past the TTL, b seen again"


def test_warm_pool_says_how_long_since_an_instance_last_answered() -> None:
    pool = WarmPool(idle_ttl_s=300)
    assert pool.idle_s(5) == math.inf, "no answer yet"
    pool.seen("a", 10)
    pool.seen("b", 20)
    pool.seen("a", 30)
    assert pool.idle_s(42) == 12
    assert pool.idle_s(29) == 0, "never negative (an answer timed after now)"


def test_warm_pool_forgets_idle_instances_and_counts_cold_hits() -> None:
    pool = WarmPool(idle_ttl_s=300)
    pool.seen("a", 0, cold=True)
    pool.seen("b", 100)
    pool.seen("a", 200)
    assert pool.warm(250) == 2 and pool.cold_hits == 1
    assert pool.warm(450) == 1


def test_late_reports_do_not_keep_finished_requests_counted() -> None:
    """APISIX's logger reports answers up to a second late; 1,000 requests of 2 ms each, one every
    millisecond, are at most a handful in flight at any time, not all of the last second's."""
    out = Outstanding(10.0)
    now = 0.0
    for i in range(1000):
        now = i / 1000
        out.add(now)
        if i >= 500:
            out.done(now, seconds=0.002)
    in_flight = out.count(now)
    assert in_flight <= 6, f"{in_flight} counted in flight"
    for _ in range(500):
        out.done(now + 0.5, seconds=0.002)
    assert out.count(now + 0.5) == 0, "each report closes one dispatch, lapsed ones first"


def test_without_answer_times_a_dispatch_counts_until_its_ttl() -> None:
    out = Outstanding(10.0)
    out.add(0.0)
    out.add(1.0)
    assert out.count(5.0) == 2
    out.done(5.0)
    assert out.count(5.0) == 1 and out.count(11.5) == 0


def test_slow_answers_widen_the_horizon_and_old_answer_times_are_forgotten() -> None:
    out = Outstanding(60.0)
    out.done(0.0, seconds=3.0)
    out.add(1.0)
    assert out.count(5.0) == 1, "answers have taken 3 s lately: a 4 s old dispatch may still run"
    assert out.count(7.0) == 0
    out.add(100.0)
    assert out.count(150.0) == 1, "no answer times for a while: back to the ttl"


def test_a_rare_slow_answer_does_not_count_every_request_for_its_duration() -> None:
    """Answers of 55 ms, one in twenty held 300 ms behind a warm-up ping, reported a second late:
    at 20 requests/s about two are in flight; counting each for the slowest answer's time would
    make it a dozen."""
    out = Outstanding(30.0)
    counted = []
    for i in range(400):
        now = i / 20
        out.add(now)
        if i >= 20:  # reported a second late
            out.done(now, seconds=0.3 if i % 20 == 0 else 0.055)
        counted.append(out.count(now))
    assert max(counted[100:]) <= 4, counted[100:]


# -- budgets and spend quotas in decide() --

BASE: dict[str, Any] = {
    "local": {"latency_target_ms": 100, "parallelism": 2, "max_queue_ms": 5000},
    "overflow": {"saturation_ratio": 20},
    "targets": [
        {"name": "aws", "kind": "aws_lambda", "url": "https://a.example", "cold_start_ms": 500},
        {"name": "ali", "kind": "aliyun_fc", "url": "https://b.example", "cold_start_ms": 800},
    ],
}
AWS = build_policy(SpillwayConfig.model_validate(BASE)).targets["aws"]
WARM_COST, COLD_COST = AWS.cost_usd, AWS.cold_cost_usd
# Past its target by more than a cold start, short of saturation: every public request goes out
# if a target allows it, and one that none allows is served locally, not shed.
HOT = LocalLoad(fresh=True, queue_ms=1000, compute_ms=10)
WARM = TargetState(warm_instances=3)


def policy(**sections: Any) -> Policy:
    return build_policy(SpillwayConfig.model_validate({**BASE, **sections}))


def routed(
    p: Policy, aws: TargetState, tenant: TenantState | None = None, ali: TargetState = WARM
) -> tuple[str, str, float]:
    """Where a public request of tenant "team" goes, why, and at what cost."""
    headers = {"x-data-classification": "public", "x-tenant": "team"}
    features = RequestFeatures("/v2/models/m/infer", headers, {}, "m")
    tenants = {"team": tenant} if tenant is not None else {}
    decision = decide(features, Snapshot({"m": HOT}, {"aws": aws, "ali": ali}, tenants), p)
    return decision.target, decision.label, decision.cost_usd


def test_a_target_whose_daily_budget_the_request_would_pass_gets_no_more() -> None:
    """Spend of an earlier hour today counts: the daily budget holds when the hourly one is fresh."""
    p = policy(budgets={"per_target_daily_usd": {"aws": 1.0}})
    assert routed(p, WARM._replace(spent_day_usd=1.0 - WARM_COST))[0] == "aws", "exactly reaches it"
    assert routed(p, WARM._replace(spent_day_usd=1.0 - WARM_COST / 2))[0] == "ali"
    assert routed(p, WARM._replace(spent_day_usd=5.0))[0] == "ali"


def test_a_target_whose_hourly_budget_the_request_would_pass_gets_no_more() -> None:
    p = policy(budgets={"per_target_hourly_usd": {"aws": 1.0}})
    assert routed(p, WARM._replace(spent_hour_usd=1.0 - 2 * WARM_COST))[0] == "aws"
    assert routed(p, WARM._replace(spent_hour_usd=1.0 - WARM_COST / 2, spent_day_usd=9.0))[0] == "ali"


def test_the_request_that_brings_spend_exactly_to_the_budget_still_goes() -> None:
    for section in ("per_target_hourly_usd", "per_target_daily_usd"):
        p = policy(budgets={section: {"aws": WARM_COST}})
        assert routed(p, WARM)[:2] == ("aws", "overflow_warm"), section


def test_a_cold_request_costs_its_start_and_the_budget_counts_it() -> None:
    """Between the warm and the cold price: a warm instance may take the request, a cold start may not."""
    assert COLD_COST > WARM_COST
    p = policy(budgets={"per_target_hourly_usd": {"aws": (WARM_COST + COLD_COST) / 2}})
    assert routed(p, WARM) == ("aws", "overflow_warm", WARM_COST)
    assert routed(p, TargetState())[:2] == ("ali", "overflow_warm"), "a cold start would pass the budget"
    ali_open = TargetState(breaker=BreakerState.OPEN)
    assert routed(policy(), TargetState(), ali=ali_open) == ("aws", "overflow_cold", COLD_COST)


def test_a_tenant_past_its_hourly_or_daily_spend_quota_stays_local() -> None:
    """Spend quotas narrow the cloud, they do not shed: the request is served on premises."""
    for field, spent in (("hourly_usd", "spent_hour_usd"), ("daily_usd", "spent_day_usd")):
        p = policy(tenants={"quotas": {"team": {field: 1.0}}})
        below = TenantState(**{spent: 1.0 - WARM_COST})
        assert routed(p, WARM, below)[0] == "aws", field
        over = TenantState(**{spent: 1.0 - WARM_COST / 2})
        assert routed(p, WARM, over)[:2] == (LOCAL, "no_target"), field


def test_the_default_quota_applies_to_every_tenant_not_listed() -> None:
    p = policy(tenants={"default": {"requests_per_minute": 5, "daily_usd": 1.0}, "quotas": {"vip": {}}})
    assert routed(p, WARM, TenantState(requests_last_minute=5))[:2] == (SHED, "tenant_rate")
    assert routed(p, WARM, TenantState(spent_day_usd=1.0))[0] == LOCAL
    vip = RequestFeatures("/v2/models/m/infer", {"x-data-classification": "public", "x-tenant": "vip"})
    busy_vip = Snapshot({"": HOT}, {"aws": WARM}, {"vip": TenantState(requests_last_minute=50)})
    assert decide(vip, busy_vip, p).target == "aws", "a listed tenant has its own quota"


def test_a_half_open_breaker_takes_only_its_probe() -> None:
    p = policy()
    waiting = WARM._replace(breaker=BreakerState.HALF_OPEN, probe_allowed=False)
    assert routed(p, waiting)[0] == "ali"
    assert routed(p, waiting._replace(probe_allowed=True))[0] == "aws"
