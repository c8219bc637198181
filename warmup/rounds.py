"""One warm-up round over every configured target, and the plan that sizes it."""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

import requests

from gateway_plugin.config import ConfigError, SpillwayConfig, Target, WarmTarget
from gateway_plugin.config.warmup import wanted
from gateway_plugin.costs import monthly_provisioned_cost_usd, monthly_warm_cost_usd, warm_ping_cost_usd
from gateway_plugin.targets.urls import masked_url
from warmup import schedules
from warmup.demand import overflow_rates
from warmup.pinger import TargetResult, failed_target, warm_target
from warmup.provisioned import ProvisionFailed, failed_provisioning, provision_target, provisioner_for
from warmup.report import added_up, prometheus_text, spent_before, write_atomically
from warmup.transports import PingFailed, describe, transport_for

log = logging.getLogger("spillway.warmup")


@dataclass(frozen=True)
class PlanRow:
    target: str
    instances: int
    how: str
    schedule: str
    # What pings cost, and what provisioned concurrency would (None: no price configured), so an
    # operator can compare; ``provisioned`` says which of the two the target uses.
    monthly_usd: float
    provisioned_monthly_usd: float | None = None
    provisioned: bool = False


def _how(spec: WarmTarget) -> str:
    sizing = _sizing(spec)
    return f"provisioned concurrency, {sizing}" if spec.provisioned else sizing


def _sizing(spec: WarmTarget) -> str:
    if spec.adaptive is not None:
        a = spec.adaptive
        return f"adaptive (Little's law, headroom {a.headroom:g}, {a.floor}-{a.ceiling})"
    if spec.windows:
        return "windows " + ", ".join(f"{w.start}-{w.end}:{w.instances}" for w in spec.windows)
    return "fixed"


def measured_rates(config: SpillwayConfig) -> dict[str, float | None]:
    rates: dict[str, float | None] = {}
    for name, spec in config.warmup.targets.items():
        if spec.adaptive is None:
            continue
        try:
            rates[name] = overflow_rates(spec.adaptive.metrics_url, spec.adaptive.sample_s).get(name, 0.0)
        except requests.RequestException as exc:
            log.warning(
                "cannot read the gateway's metrics at %s for %s (%s); sizing from the schedule",
                masked_url(spec.adaptive.metrics_url),
                name,
                describe(exc),
            )
            rates[name] = None
    return rates


def plan(config: SpillwayConfig, now: datetime.datetime, rates: dict[str, float | None]) -> list[PlanRow]:
    local = now.astimezone(ZoneInfo(config.warmup.timezone)).time()
    targets = {t.name: t for t in config.targets}
    pings_per_hour = 3600 / config.warmup.interval_s
    rows = []
    for name, spec in config.warmup.targets.items():
        target = targets[name]
        n = wanted(spec, local, rates.get(name), target.cost.expected_duration_ms / 1000)
        every = config.warmup.interval_s
        cloud = (
            f"EventBridge {schedules.eventbridge_schedule(spec, every)['schedule_expression']}, "
            f"FC {schedules.fc_timer_trigger(spec, every)['cronExpression']}"
        )
        cost = monthly_warm_cost_usd(target.cost, n, pings_per_hour, spec.dwell_ms)
        provisioned = monthly_provisioned_cost_usd(target.cost, target.kind, n)
        rows.append(
            PlanRow(
                name,
                n,
                _how(spec),
                f"every {every:g} s ({cloud})",
                round(cost, 4),
                None if provisioned is None else round(provisioned, 4),
                spec.provisioned,
            )
        )
    return rows


def run_round(
    config: SpillwayConfig,
    rows: list[PlanRow],
    on_wave: Callable[[TargetResult], None] | None = None,
) -> list[TargetResult]:
    """Every target at once, each on its own thread: one slow target does not delay the others, and
    one that cannot be pinged or provisioned at all (no credentials, a blank key, a refused call) is
    a failed target."""
    targets: dict[str, Target] = {t.name: t for t in config.targets}
    results: dict[str, TargetResult] = {}

    def one(row: PlanRow) -> None:
        spec = config.warmup.targets[row.target]
        if spec.provisioned:
            results[row.target] = _provision(targets[row.target], spec, row)
            return
        try:
            transport = transport_for(targets[row.target], max(1, row.instances))
        except (PingFailed, ConfigError) as exc:
            results[row.target] = failed_target(row.target, row.instances, str(exc))
            return
        results[row.target] = warm_target(
            row.target,
            transport,
            row.instances,
            schedules.ping_payload(spec),
            models=spec.models,
            probe=spec.probe,
            waves=config.warmup.waves,
            timeout_s=config.warmup.ping_timeout_s,
            on_wave=on_wave,
        )

    threads = [threading.Thread(target=one, args=(row,), name=f"warmup-{row.target}") for row in rows]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[row.target] for row in rows]


def _provision(target: Target, spec: WarmTarget, row: PlanRow) -> TargetResult:
    try:
        provisioner = provisioner_for(target, spec)
    except (ValueError, ProvisionFailed) as exc:
        return failed_provisioning(row.target, row.instances, f"{exc}; set the cloud's credentials")
    return provision_target(row.target, provisioner, row.instances)


def round_spend_usd(config: SpillwayConfig, results: list[TargetResult]) -> dict[str, float]:
    """What a round's pings cost per target: every ping sent, in every wave, priced as the plan
    prices it."""
    costs = {t.name: t.cost for t in config.targets}
    dwell = {name: spec.dwell_ms for name, spec in config.warmup.targets.items()}
    return {r.target: r.pings * warm_ping_cost_usd(costs[r.target], dwell[r.target]) for r in results}


def write_report(config: SpillwayConfig, results: list[TargetResult]) -> None:
    """The round's report, its spend counters carried on from the last one, to warmup.report_file."""
    if config.warmup.report_file:
        path = Path(config.warmup.report_file)
        spent = added_up(spent_before(path), round_spend_usd(config, results))
        write_atomically(path, prometheus_text(results, spent))
