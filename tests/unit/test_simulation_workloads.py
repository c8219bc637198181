"""The trace families shaped like published serverless workloads: each gives the mean rate asked
for, the same trace for the same parameters, and the shape its characterisation describes."""

from __future__ import annotations

import statistics

import pytest

from gateway_plugin.simulation.trace import TraceError, generate
from gateway_plugin.simulation.trace import load as load_trace
from gateway_plugin.simulation.workloads import FAMILIES


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_has_the_mean_asked_for_and_the_same_parameters_give_the_same_trace(name: str) -> None:
    trace = generate(name, {"mean": 37.0, "seconds": 1800})
    assert len(trace.rates) == 1800 and min(trace.rates) >= 0
    assert statistics.fmean(trace.rates) == pytest.approx(37.0)
    assert generate(name, {"mean": 37.0, "seconds": 1800}) == trace
    assert generate(name, {"mean": 37.0, "seconds": 1800, "seed": 2}) != trace


def test_heavy_rates_are_constant_per_minute_and_heavy_tailed() -> None:
    rates = generate("heavy", {"mean": 10.0, "seconds": 3600}).rates
    minutes = [rates[i] for i in range(0, 3600, 60)]
    assert all(len(set(rates[i : i + 60])) == 1 for i in range(0, 3600, 60))
    ordered = sorted(minutes)
    assert ordered[-2] / statistics.median(ordered) > 3, "the busiest minutes are several times the typical"


def test_bursts_rise_10_to_50_fold_within_seconds() -> None:
    rates = generate("burst", {"mean": 10.0, "seconds": 3600}).rates
    base = min(rates)
    jumps = [b / a for a, b in zip(rates, rates[2:], strict=False) if b > 5 * a]
    assert jumps and 10 <= max(rates) / base <= 51
    assert max(jumps) >= 10, "a burst reaches 10x its base within two seconds"


def test_cron_spikes_at_every_period_and_higher_at_every_major_one() -> None:
    rates = generate("cron", {"mean": 10.0, "seconds": 600, "period_s": 60, "major": 5}).rates
    base = min(rates)
    spikes = [t for t in range(600) if rates[t] > 5 * base and (t == 0 or rates[t - 1] <= 5 * base)]
    assert len(spikes) == 10 and all(t % 60 <= 1 for t in spikes)
    assert max(rates[0:3]) > 2 * max(rates[60:63])


def test_daily_cycles_between_trough_and_peak_and_sporadic_idles_between_episodes() -> None:
    daily = generate("daily", {"mean": 10.0, "seconds": 1200, "period_s": 1200, "sigma": 0}).rates
    assert max(daily) / min(daily) == pytest.approx(8, rel=0.01)
    sporadic = generate("sporadic", {"mean": 10.0, "seconds": 7200}).rates
    idle = [t for t, r in enumerate(sporadic) if r == 0]
    assert 0.5 < len(idle) / len(sporadic) < 1, "mostly idle"
    longest = run = 0
    for rate in sporadic:
        run = run + 1 if rate == 0 else 0
        longest = max(longest, run)
    assert longest > 300, "idle for longer than a function's usual idle TTL"


def test_a_family_named_with_bad_parameters_is_refused() -> None:
    with pytest.raises(TraceError, match="key=number"):
        load_trace("burst:low=lots")
    assert load_trace("cron:mean=5,seconds=60").rates  # type: ignore[union-attr]


def test_rare_bursts_spend_about_on_over_on_plus_off_of_the_time_at_factor_times_the_base() -> None:
    rates = generate("rare_bursts", {"mean": 10.0, "seconds": 200_000, "on_s": 120, "off_s": 600}).rates
    base = min(rates)
    assert max(rates) / base == pytest.approx(10.0)
    bursting = sum(r > 5 * base for r in rates) / len(rates)
    assert 0.12 < bursting < 0.22, f"{bursting:.3f} of the time bursting, not about 120 / 720"
    runs, run = [], 0
    for rate in rates:
        run = run + 1 if rate > 5 * base else 0
        if run == 1:
            runs.append(0)
        if run:
            runs[-1] = run
    assert 80 < statistics.fmean(runs) < 160, "bursts last about on_s on average"


def test_a_flash_crowd_multiplies_the_day_by_its_factor_for_its_stretch() -> None:
    params = {"mean": 10.0, "seconds": 1200, "period_s": 1200, "sigma": 0, "flash_s": 60}
    day = generate("daily", params).rates
    crowded = generate("flash", params).rates
    ratios = [c / d for c, d in zip(crowded, day, strict=True)]
    inside = [t for t, ratio in enumerate(ratios) if ratio > ratios[0] * 5]
    assert len(inside) == 60 and inside == list(range(inside[0], inside[0] + 60))
    assert ratios[inside[0]] / ratios[0] == pytest.approx(10.0)
    moved = generate("flash", {**params, "seed": 2}).rates
    assert [t for t, r in enumerate(moved) if r > 5 * max(day)] != inside, "the seed moves the crowd"
