"""spillway.yaml: one file, validated by pydantic models, one module per part of it; an invalid file
is refused with the path of each bad field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from gateway_plugin.config.audit import AuditSettings
from gateway_plugin.config.cluster import LocalCluster, LocalCost, LocalEndpoint, LocalHealth
from gateway_plugin.config.content import ContentChecks
from gateway_plugin.config.model import Model
from gateway_plugin.config.policy import (
    Admission,
    BreakerSettings,
    Budgets,
    Match,
    Overflow,
    Residency,
    Rule,
    TenantQuota,
    Tenants,
)
from gateway_plugin.config.runner import MetricsSettings, OutcomeSettings, RunnerSettings
from gateway_plugin.config.shared_state import SharedState
from gateway_plugin.config.targets import (
    FC_MAX_HTTP_BYTES,
    FC_MAX_INVOKE_BYTES,
    LAMBDA_MAX_REQUEST_BYTES,
    Target,
    TargetCost,
)
from gateway_plugin.config.thresholds import GaugeLimit, LoadAware, Share, Thresholds, merged
from gateway_plugin.config.warmup import Adaptive, WarmTarget, WarmupSettings, Window, provisioning_problem
from gateway_plugin.simulation.settings import SimulationSettings
from gateway_plugin.targets.urls import masked_url

__all__ = [
    "FC_MAX_HTTP_BYTES",
    "FC_MAX_INVOKE_BYTES",
    "LAMBDA_MAX_REQUEST_BYTES",
    "Adaptive",
    "AuditSettings",
    "BreakerSettings",
    "Budgets",
    "ConfigError",
    "ContentChecks",
    "GaugeLimit",
    "LoadAware",
    "LocalCluster",
    "LocalCost",
    "LocalEndpoint",
    "LocalHealth",
    "Match",
    "MetricsSettings",
    "OutcomeSettings",
    "Overflow",
    "Residency",
    "Rule",
    "RunnerSettings",
    "Share",
    "SharedState",
    "SpillwayConfig",
    "Target",
    "TargetCost",
    "TenantQuota",
    "Tenants",
    "Thresholds",
    "WarmTarget",
    "WarmupSettings",
    "Window",
    "load",
    "parse",
]


class ConfigError(ValueError):
    """The config file cannot be used; the message names the file and the bad fields."""


class SpillwayConfig(Model):
    runner: RunnerSettings = Field(
        default_factory=RunnerSettings,
        description="how the runner meets APISIX: its socket, workers, plugins",
    )
    local: LocalCluster = Field(default_factory=LocalCluster, description="the on-prem Triton cluster")
    targets: list[Target] = Field(
        default_factory=list, description="cloud functions that take overflow, in the default overflow order"
    )
    rules: list[Rule] = Field(
        default_factory=list,
        description="first match by priority (higher first) wins; a request no rule matches: overflow",
    )
    residency: Residency = Field(
        default_factory=Residency, description="which data classes may leave the premises"
    )
    content: ContentChecks = Field(
        default_factory=ContentChecks,
        description="what keeps a request home by its text (routes and rules with content_checks)",
    )
    overflow: Overflow = Field(
        default_factory=Overflow, description="when requests spill to the cloud and when they come back"
    )
    admission: Admission = Field(
        default_factory=Admission, description="deadlines and priorities the requests carry"
    )
    breaker: BreakerSettings = Field(
        default_factory=BreakerSettings,
        description="when a failing target stops taking overflow, and returns",
    )
    budgets: Budgets = Field(
        default_factory=Budgets, description="no overflow to a target past these estimated spends"
    )
    tenants: Tenants = Field(
        default_factory=Tenants, description="who a request counts for, and their quotas"
    )
    metrics: MetricsSettings = Field(
        default_factory=MetricsSettings, description="the runner's Prometheus endpoint and decision header"
    )
    outcomes: OutcomeSettings = Field(
        default_factory=OutcomeSettings,
        description="where the route's http-logger reports what happened to each request",
    )
    audit: AuditSettings = Field(
        default_factory=AuditSettings,
        description="one line per request on both routes, written by an APISIX logger",
    )
    warmup: WarmupSettings = Field(
        default_factory=WarmupSettings, description="how many instances of each target to keep warm, and when"
    )
    simulation: SimulationSettings = Field(
        default_factory=SimulationSettings, description="what `simulate` assumes; the runner ignores it"
    )
    shared_state: SharedState | None = Field(
        default=None, description="share decision state through Redis; absent: this runner alone"
    )
    load_aware: LoadAware | None = Field(
        default=None,
        description="the seed design's threshold keys, read as local.thresholds (see check-config)",
    )

    def thresholds(self) -> Thresholds:
        """``local.thresholds`` with ``load_aware``'s keys added."""
        return merged(self.local.thresholds, self.load_aware)

    def declared_models(self) -> set[str]:
        """Models the config itself names (latency and first-token targets, rules)."""
        named = set(self.local.model_latency_targets_ms) | set(self.local.model_ttft_targets_ms)
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
        for section, named in (("simulation", self.simulation.targets), ("warmup", self.warmup.targets)):
            if set(named) - set(names):
                raise ValueError(f"{section} names unknown targets {sorted(set(named) - set(names))}")
        if self.content.classify_as.strip().lower() in {c.lower() for c in self.residency.cloud_allowed}:
            raise ValueError(
                f"content.classify_as {self.content.classify_as!r} is a class residency.cloud_allowed lets "
                "leave: a request whose text matched must stay home; name a class that may not leave"
            )
        if self.residency.consumer_ceilings and self.tenants.source != "consumer":
            raise ValueError(
                "residency.consumer_ceilings needs tenants.source: consumer (else no consumer is known)"
            )
        if self.runner.workers > 1 and self.shared_state is None:
            raise ValueError(
                f"runner.workers is {self.runner.workers}: more than one worker needs a shared_state "
                "section, through which the workers share in-flight counts, budgets, breakers and quotas "
                "(alone, each would count only its own)"
            )
        self.thresholds()
        if self.metrics.listen and self.metrics.listen == self.outcomes.listen:
            raise ValueError(
                f"metrics.listen and outcomes.listen are both {self.metrics.listen}: give each its own port"
            )
        for budget in (self.budgets.per_target_hourly_usd, self.budgets.per_target_daily_usd):
            if set(budget) - set(names):
                raise ValueError(f"budgets name unknown targets {sorted(set(budget) - set(names))}")
        return self

    @model_validator(mode="after")
    def _provisionable(self) -> SpillwayConfig:
        targets = {t.name: t for t in self.targets}
        for name, spec in self.warmup.targets.items():
            problem = provisioning_problem(name, spec, targets[name]) if spec.provisioned else None
            if problem is not None:
                raise ValueError(problem)
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


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def _yaml_error(path: Path, exc: yaml.YAMLError | ValueError) -> ConfigError:
    """Where the YAML broke and why, never the text there: PyYAML quotes the line, which may hold a
    URL's password, and a value it cannot convert may be a secret; a URL in a problem is masked."""
    if isinstance(exc, ValueError):
        return ConfigError(f"{path} holds a date, number or !! tag that YAML cannot read; correct it")
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return ConfigError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}; correct it")
    mark, began = exc.problem_mark, exc.context_mark
    problem = _URL.sub(lambda url: masked_url(url.group()), exc.problem or "")
    text = f"{path} is not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    if exc.context and began is not None:
        text += f" ({exc.context} from line {began.line + 1}, column {began.column + 1})"
    return ConfigError(text + "; correct the YAML there")


def load(path: Path | str) -> SpillwayConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start + 1}); save it as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise _yaml_error(path, exc) from None
    return parse(data, str(path))
