"""``warmup:``: how many instances of each target to keep warm, and when.

Adaptive sizing is Little's law: instances busy at once = overflow rate x cloud latency, times
a headroom, clamped to a floor and a ceiling. The warm-up's rounds and ``simulate`` size alike.
"""

from __future__ import annotations

import math
from datetime import time as clock_time

from pydantic import Field

from gateway_plugin.config.model import Model
from gateway_plugin.config.targets import Target

# The unpublished version each platform names, which neither will provision.
UNPUBLISHED = {"aws_lambda": "$LATEST", "aliyun_fc": "LATEST"}


class Window(Model):
    """A time-of-day window (``HH:MM``, in ``warmup.timezone``) with its own instance count."""

    start: str = Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$", description="when the window opens, HH:MM")
    end: str = Field(
        pattern=r"^([01]\d|2[0-4]):[0-5]\d$",
        description="when it closes, HH:MM (24:00: midnight; before start: the window spans midnight)",
    )
    instances: int = Field(ge=0, description="instances to keep warm within the window")


class Adaptive(Model):
    """Size from the overflow the gateway reports: rate x cloud latency x headroom (Little's law)."""

    metrics_url: str = Field(description="the runner's /metrics, e.g. http://127.0.0.1:9095/metrics")
    sample_s: float = Field(default=10.0, gt=0, description="the overflow rate is measured over this")
    headroom: float = Field(
        default=1.5, ge=1.0, description="the count is overflow rate x cloud latency x this"
    )
    floor: int = Field(default=0, ge=0, description="the fewest instances it sizes to")
    ceiling: int = Field(default=20, ge=1, description="the most instances it sizes to")


class WarmTarget(Model):
    instances: int = Field(
        default=1, ge=0, description="fixed count, when neither windows nor adaptive apply"
    )
    windows: list[Window] = Field(
        default_factory=list,
        description="time-of-day windows with their own count; the first that holds now wins",
    )
    adaptive: Adaptive | None = Field(
        default=None,
        description="size from the gateway's overflow rate, never below the fixed or windowed count "
        "(unset: not adaptive)",
    )
    dwell_ms: int = Field(default=1000, ge=0, le=60_000, description="how long each ping holds its instance")
    probe: bool = Field(default=False, description="run one synthetic inference per model")
    models: list[str] = Field(default_factory=list, description="models to check (default: all)")
    provisioned: bool = Field(
        default=False,
        description="set the platform's provisioned concurrency to the wanted count instead of pinging",
    )
    qualifier: str | None = Field(
        default=None, description="alias or published version to provision (default: the target's qualifier)"
    )

    def provisioned_qualifier(self, target: Target) -> str | None:
        return self.qualifier or target.qualifier


def provisioning_problem(name: str, spec: WarmTarget, target: Target) -> str | None:
    """Why ``spec`` cannot provision ``target``, in words that say what to set; None when it can."""
    where = f"warmup.targets.{name}: provisioned"
    if target.kind not in UNPUBLISHED:
        return (
            f"{where} needs a target of kind aws_lambda or aliyun_fc (an http target has no "
            "provisioned concurrency to set); ping it instead"
        )
    if not target.function_name or (target.kind == "aliyun_fc" and not target.service_name):
        needed = "function_name and service_name" if target.kind == "aliyun_fc" else "function_name"
        return f"{where} needs the target's {needed}: the function whose provisioned concurrency is set"
    qualifier = spec.provisioned_qualifier(target)
    unpublished = UNPUBLISHED[target.kind]
    if qualifier is None:
        return (
            f"{where} needs a qualifier, the alias or published version to provision "
            f"({unpublished} cannot be provisioned); set warmup.targets.{name}.qualifier or the "
            "target's qualifier"
        )
    if qualifier.upper() == unpublished:
        return (
            f"{where}: qualifier {qualifier!r} is refused, as the platform refuses it; name an alias "
            "or a published version"
        )
    if target.mode == "invoke" and spec.qualifier is not None and spec.qualifier != target.qualifier:
        invoked = (
            f"qualifier {target.qualifier!r}"
            if target.qualifier
            else f"the unqualified function ({unpublished})"
        )
        return (
            f"{where}: the target invokes {invoked}, so instances provisioned for {spec.qualifier!r} "
            "would serve none of its requests; give both the same qualifier"
        )
    return None


class WarmupSettings(Model):
    targets: dict[str, WarmTarget] = Field(
        default_factory=dict, description="target name → how many to keep warm"
    )
    interval_s: float = Field(
        default=240.0, gt=0, description="between rounds (idle instances go after 3-10 min)"
    )
    waves: int = Field(default=3, ge=1, description="ping waves per round before giving up on a count")
    ping_timeout_s: float = Field(default=30.0, gt=0, description="how long one ping may take, in s")
    timezone: str = Field(default="UTC", description="for windows")
    report_file: str | None = Field(
        default=None,
        description="Prometheus text file the pinger writes and the runner reads warm pools from",
    )


def littles_law(rate_per_s: float, latency_s: float, headroom: float, floor: int, ceiling: int) -> int:
    return max(floor, min(ceiling, math.ceil(rate_per_s * latency_s * headroom)))


def _in_window(window: Window, now: clock_time) -> bool:
    start = clock_time.fromisoformat(window.start)
    end = clock_time(23, 59, 59, 999999) if window.end == "24:00" else clock_time.fromisoformat(window.end)
    if start <= end:
        return start <= now < end
    return now >= start or now < end


def scheduled(spec: WarmTarget, now: clock_time) -> int:
    """The first window containing ``now``, else the fixed count."""
    return next((w.instances for w in spec.windows if _in_window(w, now)), spec.instances)


def wanted(spec: WarmTarget, now: clock_time, overflow_rate_per_s: float | None, latency_s: float) -> int:
    """Adaptive when a rate is known (never below the schedule), else the schedule."""
    base = scheduled(spec, now)
    if spec.adaptive is None or overflow_rate_per_s is None:
        return base
    a = spec.adaptive
    return max(base, littles_law(overflow_rate_per_s, latency_s, a.headroom, a.floor, a.ceiling))
