"""What the clouds' own schedulers send, exactly as the Terraform modules deploy it.

Both modules (``infra/terraform/modules/aws_function/warmup.tf`` and the timer triggers in
``modules/aliyun_function/triggers.tf``) create ``warmup_pings`` identical schedules, each sending
one warm-up ping, all on the **same aligned cron tick**: EventBridge Scheduler
``cron(0/4 * * * ? *)`` (UTC, flexible time window off) and FC timer ``0 0/4 * * * *`` (cron with
seconds). The pings of one tick therefore arrive together and, each holding its instance for
``dwell_ms``, land on distinct instances: N pings keep about N Lambda instances warm (one request
per instance), and about N / ``instance_concurrency`` FC instances. A ``rate(...)`` or ``@every``
schedule would not do this: each starts counting when it is created, so the pings of several
schedules drift apart and all reach the same instance.

EventBridge Scheduler delivers its target ``Input`` to Lambda as the event itself; an FC timer
trigger delivers ``{"triggerTime", "triggerName", "payload"}`` with its configured ``payload``
string. Both carry the contract's warm-up ping, the string the modules render with
``jsonencode`` (sorted keys, as :func:`functions.contract.warmup_payload` writes it). The functions
below build one schedule's arguments; the modules repeat it ``warmup_pings`` times.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from functions.contract import warmup_payload
from gateway_plugin.config import WarmTarget


def ping_payload(spec: WarmTarget) -> str:
    """The ping each schedule sends (the modules' ``warmup_payload``)."""
    return warmup_payload(dwell_ms=spec.dwell_ms, models=tuple(spec.models), probe=spec.probe)


def minutes(interval_s: float) -> int:
    return max(1, math.floor(interval_s / 60))


def _minute_field(interval_s: float, step: str) -> str:
    """The minute field of a tick every ``minutes(interval_s)`` minutes from the top of the hour.

    A step that does not divide 60 leaves a shorter gap at the hour, never a longer one; a minute
    field cannot step by an hour or more, so longer intervals tick hourly.
    """
    m = minutes(interval_s)
    return "0" if m >= 60 else f"{step}/{m}"


def eventbridge_schedule(spec: WarmTarget, interval_s: float) -> dict[str, Any]:
    """One ``aws_scheduler_schedule`` as the AWS module builds it: the aligned cron tick (the
    module's ``warmup_schedule_expression``), UTC, no flexible window, and the target's Input."""
    return {
        "schedule_expression": f"cron({_minute_field(interval_s, '0')} * * * ? *)",
        "schedule_expression_timezone": "UTC",
        "flexible_time_window": {"mode": "OFF"},
        "input": ping_payload(spec),
    }


def fc_timer_trigger(spec: WarmTarget, interval_s: float) -> dict[str, Any]:
    """One FC timer trigger's ``trigger_config`` as the Alibaba module builds it: the aligned cron
    tick with seconds (the module's ``warmup_cron_expression``), enabled, and the ping as payload."""
    return {
        "cronExpression": f"0 {_minute_field(interval_s, '0')} * * * *",
        "enable": True,
        "payload": ping_payload(spec),
    }


def crontab_line(interval_s: float, config: Path, python: str = "/opt/spillway/.venv/bin/python") -> str:
    """A crontab entry for this package's pinger, on the same tick as the cloud schedules: one
    ``warmup run --once`` sends all of a round's overlapping pings itself."""
    return (
        f"{_minute_field(interval_s, '*')} * * * * {python} -m warmup run --once --config {config} "
        ">> /var/log/spillway-warmup.jsonl 2>&1"
    )
