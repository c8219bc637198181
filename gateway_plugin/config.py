"""``spillway.yaml``: validated once at start; a bad field is named by its path."""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway_plugin.routing.header_names import FORWARDED_TO_CLOUD, HeaderName
from gateway_plugin.routing.policy import RuleAction
from gateway_plugin.shared_state_config import SharedState as SharedState
from gateway_plugin.simulation.settings import SimulationSettings


class ConfigError(ValueError):
    """The config file cannot be used; the message names the file and the bad fields."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RunnerSettings(_Model):
    conf_ttl_s: float | None = Field(
        default=None,
        gt=0,
        description="how long a prepared conf lives; default 1.2 x APISIX_CONF_EXPIRE_TIME",
    )
    socket: str | None = Field(default=None, description="socket path when APISIX_LISTEN_ADDRESS is unset")
    uvloop: bool = Field(default=True, description="run on uvloop where installed")
    route_token_env: str = Field(
        default="SPILLWAY_ROUTE_TOKEN",
        description="environment variable holding the route token that makes cloud X-Spillway-Target "
        "values unforgeable (required when a target is in upstream mode)",
    )
    socket_group: str | None = Field(
        default=None,
        description="group that may use the socket (0660) when APISIX's workers run as another user; "
        "default: the runner's user only (0600)",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="runner processes accepting on the one socket (more than one needs shared_state)",
    )


# Platform payload limits. Lambda takes 6 MB per synchronous invocation; Function URL and Invoke
# events carry a binary body base64-encoded (4 bytes per 3), inside an envelope of headers and
# context, for which 64 KiB is kept. FC's HTTP trigger passes 32 MB bodies as they are; its
# InvokeFunction event carries them base64-encoded like Lambda's.
_ENVELOPE_BYTES = 64 * 1024
LAMBDA_MAX_REQUEST_BYTES = (6 * 1024 * 1024 - _ENVELOPE_BYTES) * 3 // 4
FC_MAX_HTTP_BYTES = 32 * 1024 * 1024
FC_MAX_INVOKE_BYTES = (32 * 1024 * 1024 - _ENVELOPE_BYTES) * 3 // 4


class LocalEndpoint(_Model):
    url: str = Field(description="Triton's HTTP endpoint, http://host:port")
    metrics_url: str = Field(description="Triton's Prometheus endpoint, http://host:8002/metrics")


class LocalCluster(_Model):
    """The on-prem Triton cluster: where requests go while it meets its latency target."""

    endpoints: list[LocalEndpoint] = Field(default_factory=list, description="every on-prem Triton to scrape")
    latency_target_ms: float = Field(default=200.0, gt=0, description="default p50 latency target")
    model_latency_targets_ms: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="per-model targets"
    )
    parallelism: int = Field(default=1, ge=1, description="requests the cluster runs at once per model")
    scrape_period_s: float = Field(default=0.25, gt=0, le=10, description="metrics scrape period")
    stale_after_s: float = Field(default=2.0, gt=0, description="signals older than this are missing")
    max_queue_ms: float = Field(
        default=5000.0, gt=0, description="past this local wait, shed instead of queueing"
    )


class TargetCost(_Model):
    """Per-request price model: requests, GB-seconds (Lambda) or compute units (FC), GPU-seconds."""

    usd_per_request: float = Field(default=0.0000002, ge=0)
    memory_gb: float = Field(default=4.0, gt=0)
    usd_per_gb_second: float = Field(default=0.0000166667, ge=0)
    usd_per_gpu_second: float = Field(default=0.0, ge=0)
    expected_duration_ms: float = Field(default=100.0, gt=0, description="billed time of one inference")
    billed_init: bool = Field(default=True, description="a cold start's init time is billed (Lambda images)")
    usd_per_idle_second: float = Field(default=0.0, ge=0, description="a live idle instance (FC's idle GPUs)")


class Target(_Model):
    """A cloud function that takes overflow."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$", description="the X-Spillway-Target value")
    kind: Literal["aws_lambda", "aliyun_fc", "http"]
    mode: Literal["upstream", "invoke"] = Field(
        default="upstream", description="upstream: APISIX proxies; invoke: the runner calls the cloud API"
    )
    url: str | None = Field(default=None, description="function URL / HTTP trigger (upstream mode)")
    function_name: str | None = Field(default=None, description="function to invoke (invoke mode)")
    service_name: str | None = Field(default=None, description="FC service (invoke mode on aliyun_fc)")
    qualifier: str | None = None
    region: str | None = None
    endpoint_url: str | None = Field(default=None, description="API endpoint override (invoke mode)")
    concurrency_cap: int = Field(default=10, ge=1, description="in-flight requests the gateway allows")
    cold_start_ms: float = Field(default=5000.0, ge=0, description="expected start of a cold instance")
    timeout_s: float = Field(default=30.0, gt=0)
    signing_key_env: str | None = Field(
        default="SPILLWAY_SIGNING_KEY", description="environment variable with the X-Spillway-Signature key"
    )
    sign_body: bool = Field(
        default=False, description="hash the body into the signature (else UNSIGNED-PAYLOAD)"
    )
    idle_ttl_s: float = Field(default=300.0, gt=0, description="how long an idle instance stays warm")
    instance_concurrency: int = Field(default=1, ge=1, le=1000, description="requests one instance serves")
    max_request_bytes: int | None = Field(
        default=None,
        ge=1,
        description="largest request body (Content-Length) sent here; default: the platform's limit",
    )
    forward_headers: list[HeaderName] = Field(
        default_factory=list,
        description="request headers sent on to this target besides what inference needs (none by default)",
    )
    cost: TargetCost = Field(default_factory=TargetCost)

    @cached_property
    def forwarded(self) -> frozenset[str]:
        """Every request header this target may receive."""
        return FORWARDED_TO_CLOUD | frozenset(self.forward_headers)

    @property
    def request_limit_bytes(self) -> int | None:
        """The configured limit, else the platform's (None: no limit is known)."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        if self.kind == "aws_lambda":
            return LAMBDA_MAX_REQUEST_BYTES
        if self.kind == "aliyun_fc":
            return FC_MAX_INVOKE_BYTES if self.mode == "invoke" else FC_MAX_HTTP_BYTES
        return None

    @model_validator(mode="after")
    def _addressable(self) -> Target:
        if self.mode == "upstream" and not self.url:
            raise ValueError(f"target {self.name!r}: upstream mode needs url")
        if self.mode == "invoke" and self.kind == "http":
            raise ValueError(f"target {self.name!r}: kind http only works in upstream mode")
        if self.mode == "invoke" and not self.function_name:
            raise ValueError(f"target {self.name!r}: invoke mode needs function_name")
        if self.mode == "invoke" and self.kind == "aliyun_fc" and not self.service_name:
            raise ValueError(f"target {self.name!r}: invoke mode on aliyun_fc needs service_name")
        return self


class Match(_Model):
    headers: dict[HeaderName, str] = Field(default_factory=dict, description="header → regex (full match)")
    uri: str | None = Field(default=None, description="regex searched in the path")
    args: dict[str, str] = Field(default_factory=dict, description="query arg → regex (full match)")
    models: list[str] = Field(default_factory=list, description="model names (any of)")

    @field_validator("uri")
    @classmethod
    def _uri_regex(cls, value: str | None) -> str | None:
        if value is not None:
            re.compile(value)
        return value

    @field_validator("headers", "args")
    @classmethod
    def _regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            re.compile(pattern)
        return value


class Rule(_Model):
    name: str
    priority: int = Field(default=0, description="higher runs first")
    match: Match = Field(default_factory=Match)
    action: RuleAction = Field(
        description="local: stay; overflow: local until the load says otherwise; target: cloud first; shed"
    )
    targets: list[str] = Field(default_factory=list, description="fallback chain, first eligible wins")


class Residency(_Model):
    header: HeaderName = Field(
        default="x-data-classification", description="request header carrying the class"
    )
    cloud_allowed: list[str] = Field(default_factory=lambda: ["public"], description="classes that may leave")
    unclassified_may_leave: bool = Field(
        default=False, description="no header means on-prem-only unless true"
    )


class Overflow(_Model):
    enter_ratio: float = Field(default=0.8, gt=0, description="overflow when estimate > target x this")
    exit_ratio: float = Field(default=0.7, gt=0, description="stop when estimate < target x this")
    saturation_ratio: float = Field(default=4.0, gt=0, description="local is saturated past target x this")
    retry_after_s: int = Field(default=1, ge=1)
    # Spill sooner by this many times the queueing that on-prem-only arrivals alone would cause.
    onprem_headroom: float = Field(default=4.0, ge=0, le=100)

    @model_validator(mode="after")
    def _hysteresis(self) -> Overflow:
        if self.exit_ratio > self.enter_ratio:
            raise ValueError("exit_ratio must not exceed enter_ratio, or overflow would flap")
        return self


class BreakerSettings(_Model):
    consecutive_failures: int = Field(default=5, ge=1)
    failure_rate: float = Field(default=0.5, gt=0, le=1)
    window: int = Field(default=20, ge=2, description="outcomes the failure rate is taken over")
    cooldown_s: float = Field(default=5.0, gt=0)
    max_cooldown_s: float = Field(default=120.0, gt=0)
    half_open_probes: int = Field(default=1, ge=1)
    retry_budget_ratio: float = Field(default=0.1, ge=0, le=1, description="retries as a share of requests")


Usd = Annotated[float, Field(ge=0)]


class Budgets(_Model):
    per_target_hourly_usd: dict[str, Usd] = Field(default_factory=dict)
    per_target_daily_usd: dict[str, Usd] = Field(default_factory=dict)


class TenantQuota(_Model):
    requests_per_minute: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)
    hourly_usd: float | None = Field(default=None, ge=0)
    daily_usd: float | None = Field(default=None, ge=0)


class Tenants(_Model):
    header: HeaderName = Field(default="x-tenant")
    quotas: dict[Annotated[str, Field(min_length=1, max_length=256)], TenantQuota] = Field(
        default_factory=dict, description="per tenant name (at most 256 characters)"
    )
    default: TenantQuota = Field(default_factory=TenantQuota, description="quota of tenants not listed")
    max_tracked: int = Field(
        default=10_000,
        ge=1,
        description="tenants under a quota kept in memory; the least recently seen is forgotten first",
    )


class OutcomeSettings(_Model):
    """Where the route's ``http-logger`` posts what happened to each request."""

    listen: str | None = Field(
        default="127.0.0.1:9092",
        description="host:port of the runner's outcome endpoint (POST /spillway/outcomes); null: none",
    )
    batch_s: int = Field(
        default=1,
        ge=1,
        le=60,
        description="the logger's buffer_duration and inactive_timeout: outcomes arrive this late at most",
    )


class MetricsSettings(_Model):
    listen: str | None = Field(default="127.0.0.1:9091", description="host:port of the runner's /metrics")
    decision_header: bool = Field(default=True, description="add X-Spillway-Decision to answers")


class Window(_Model):
    """A time-of-day window (``HH:MM``, in ``warmup.timezone``) with its own instance count."""

    start: str = Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")
    end: str = Field(pattern=r"^([01]\d|2[0-4]):[0-5]\d$")
    instances: int = Field(ge=0)


class Adaptive(_Model):
    """Size from the overflow the gateway reports: rate x cloud latency x headroom (Little's law)."""

    metrics_url: str = Field(description="the runner's /metrics, e.g. http://127.0.0.1:9091/metrics")
    sample_s: float = Field(default=10.0, gt=0, description="the overflow rate is measured over this")
    headroom: float = Field(default=1.5, ge=1.0)
    floor: int = Field(default=0, ge=0)
    ceiling: int = Field(default=20, ge=1)


class WarmTarget(_Model):
    instances: int = Field(
        default=1, ge=0, description="fixed count, when neither windows nor adaptive apply"
    )
    windows: list[Window] = Field(default_factory=list)
    adaptive: Adaptive | None = None
    dwell_ms: int = Field(default=1000, ge=0, le=60_000, description="how long each ping holds its instance")
    probe: bool = Field(default=False, description="run one synthetic inference per model")
    models: list[str] = Field(default_factory=list, description="models to check (default: all)")


class WarmupSettings(_Model):
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


class SpillwayConfig(_Model):
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    local: LocalCluster = Field(default_factory=LocalCluster)
    targets: list[Target] = Field(default_factory=list)
    rules: list[Rule] = Field(default_factory=list)
    residency: Residency = Field(default_factory=Residency)
    overflow: Overflow = Field(default_factory=Overflow)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    budgets: Budgets = Field(default_factory=Budgets)
    tenants: Tenants = Field(default_factory=Tenants)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    outcomes: OutcomeSettings = Field(default_factory=OutcomeSettings)
    warmup: WarmupSettings = Field(default_factory=WarmupSettings)
    simulation: SimulationSettings = Field(
        default_factory=SimulationSettings, description="what `simulate` assumes; the runner ignores it"
    )
    shared_state: SharedState | None = Field(
        default=None, description="share decision state through Redis; absent: this runner alone"
    )

    def declared_models(self) -> set[str]:
        """Models the config itself names (latency targets, rules)."""
        named = set(self.local.model_latency_targets_ms)
        for rule in self.rules:
            named.update(rule.match.models)
        return named

    @model_validator(mode="after")
    def _names(self) -> SpillwayConfig:
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names) or "local" in names or "shed" in names:
            raise ValueError("target names must be unique and not 'local' or 'shed'")
        for rule in self.rules:
            unknown = set(rule.targets) - set(names)
            if unknown:
                raise ValueError(f"rule {rule.name!r} names unknown targets {sorted(unknown)}")
        if set(self.simulation.targets) - set(names):
            raise ValueError(
                f"simulation names unknown targets {sorted(set(self.simulation.targets) - set(names))}"
            )
        if set(self.warmup.targets) - set(names):
            raise ValueError(f"warmup names unknown targets {sorted(set(self.warmup.targets) - set(names))}")
        if self.runner.workers > 1 and self.shared_state is None:
            raise ValueError(
                f"runner.workers is {self.runner.workers}: more than one worker needs a shared_state "
                "section, through which the workers share in-flight counts, budgets, breakers and quotas "
                "(alone, each would count only its own)"
            )
        for budget in (self.budgets.per_target_hourly_usd, self.budgets.per_target_daily_usd):
            if set(budget) - set(names):
                raise ValueError(f"budgets name unknown targets {sorted(set(budget) - set(names))}")
        return self


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse(data: Any, source: str = "config") -> SpillwayConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    try:
        return SpillwayConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {_where(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(lines)) from None


def load(path: Path | str) -> SpillwayConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse(data, str(path))
