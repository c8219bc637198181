"""The exact payloads the clouds' own schedulers send; the functions take them as warm-up events.

EventBridge Scheduler delivers its target ``Input`` to Lambda as the event itself; an FC timer
trigger delivers ``{"triggerTime", "triggerName", "payload"}`` with its configured ``payload``
string. Both carry the contract's warm-up ping. A scheduler cannot hold N pings in flight at once,
so a cloud schedule keeps one instance warm per trigger: schedule N targets (or use this package's
pinger from cron) for N instances.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from functions.contract import warmup_payload
from gateway_plugin.config import WarmTarget


def ping_payload(spec: WarmTarget) -> str:
    return warmup_payload(dwell_ms=spec.dwell_ms, models=tuple(spec.models), probe=spec.probe)


def minutes(interval_s: float) -> int:
    return max(1, math.floor(interval_s / 60))


def eventbridge_schedule(spec: WarmTarget, interval_s: float) -> dict[str, Any]:
    """``aws_scheduler_schedule`` arguments: the rate and the target's Input."""
    m = minutes(interval_s)
    return {"schedule_expression": f"rate({m} minute{'s' if m > 1 else ''})", "input": ping_payload(spec)}


def fc_timer_trigger(spec: WarmTarget, interval_s: float) -> dict[str, Any]:
    """An FC timer trigger's config."""
    return {"cronExpression": f"@every {minutes(interval_s)}m", "enable": True, "payload": ping_payload(spec)}


def crontab_line(interval_s: float, config: Path, python: str = "/opt/spillway/.venv/bin/python") -> str:
    return (
        f"*/{minutes(interval_s)} * * * * {python} -m warmup run --once --config {config} "
        ">> /var/log/spillway-warmup.jsonl 2>&1"
    )
