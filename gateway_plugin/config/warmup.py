"""``warmup:``: how many instances of each target to keep warm, and when."""

from __future__ import annotations

from pydantic import Field

from gateway_plugin.config.model import Model


class Window(Model):
    """A time-of-day window (``HH:MM``, in ``warmup.timezone``) with its own instance count."""

    start: str = Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")
    end: str = Field(pattern=r"^([01]\d|2[0-4]):[0-5]\d$")
    instances: int = Field(ge=0)


class Adaptive(Model):
    """Size from the overflow the gateway reports: rate x cloud latency x headroom (Little's law)."""

    metrics_url: str = Field(description="the runner's /metrics, e.g. http://127.0.0.1:9095/metrics")
    sample_s: float = Field(default=10.0, gt=0, description="the overflow rate is measured over this")
    headroom: float = Field(default=1.5, ge=1.0)
    floor: int = Field(default=0, ge=0)
    ceiling: int = Field(default=20, ge=1)


class WarmTarget(Model):
    instances: int = Field(
        default=1, ge=0, description="fixed count, when neither windows nor adaptive apply"
    )
    windows: list[Window] = Field(default_factory=list)
    adaptive: Adaptive | None = None
    dwell_ms: int = Field(default=1000, ge=0, le=60_000, description="how long each ping holds its instance")
    probe: bool = Field(default=False, description="run one synthetic inference per model")
    models: list[str] = Field(default_factory=list, description="models to check (default: all)")


class WarmupSettings(Model):
    targets: dict[str, WarmTarget] = Field(
        default_factory=dict, description="target name → how many to keep warm"
    )
    interval_s: float = Field(
        default=240.0, gt=0, description="between rounds (idle instances go after 3-10 min)"
    )
    waves: int = Field(default=3, ge=1, description="ping waves per round before giving up on a count")
    ping_timeout_s: float = Field(default=30.0, gt=0)
    timezone: str = Field(default="UTC", description="for windows")
    report_file: str | None = Field(
        default=None,
        description="Prometheus text file the pinger writes and the runner reads warm pools from",
    )
