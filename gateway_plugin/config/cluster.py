"""``local:``: the on-prem Triton cluster."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway_plugin.config.model import Model
from gateway_plugin.config.thresholds import Thresholds


class LocalEndpoint(Model):
    url: str = Field(description="Triton's HTTP endpoint, http://host:port")
    metrics_url: str = Field(description="Triton's Prometheus endpoint, http://host:8002/metrics")


class DnsDiscovery(Model):
    """Members from the DNS records Kubernetes publishes for a headless Service, re-resolved every
    period: each address (A or AAAA) is a member at ``metrics_port``, or each SRV record's target at
    the record's port."""

    name: str = Field(
        min_length=1,
        max_length=253,
        description="the DNS name: triton.<namespace>.svc.cluster.local (A/AAAA), "
        "or _metrics._tcp.triton.<namespace>.svc.cluster.local (SRV)",
    )
    record: Literal["A", "AAAA", "SRV"] = Field(default="A", description="which records name the members")
    port: int = Field(default=8000, ge=1, le=65535, description="each member's inference (HTTP) port")
    metrics_port: int = Field(
        default=8002, ge=1, le=65535, description="each member's metrics port (SRV records give theirs)"
    )
    upstream_name: str | None = Field(
        default=None,
        max_length=253,
        description="the name APISIX's DNS discovery resolves for the route's on-prem upstream: "
        "unset, name:port with A/AAAA records; with SRV, the inference port's (_http._tcp.triton...)",
    )
    resolver: str | None = Field(
        default=None, description="host:port of the DNS server to ask; unset: the system's (/etc/resolv.conf)"
    )
    period_s: float = Field(default=5.0, gt=0, le=300, description="how often the name is resolved again")
    timeout_s: float = Field(default=1.0, gt=0, le=30, description="how long one resolution may take")

    @field_validator("resolver")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, _, port = value.rpartition(":")
        try:
            ipaddress.ip_address(host.strip("[]"))
            if not 0 < int(port) < 65536:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{value!r} is not an IP address and port (10.96.0.10:53, [fd00::a]:53): "
                "the resolver is asked by address"
            ) from None
        return value


class PrometheusDiscovery(Model):
    """The members and their load from the Prometheus that already scrapes them: one PromQL query a
    scrape period, each value of ``member_label`` a member, a member whose ``up`` is 0 or whose
    samples are older than ``max_age_s`` failing."""

    url: str = Field(pattern=r"^https?://", description="Prometheus' base URL, http://prometheus:9090")
    selector: str = Field(
        default='job="triton"',
        max_length=1000,
        pattern=r"^[^{}]*$",
        description='label matchers of the Tritons\' series, without braces: job="triton",namespace="ml"',
    )
    member_label: str = Field(
        default="instance", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$", description="the label that names a member"
    )
    max_age_s: float = Field(
        default=60.0, gt=0, description="a member whose newest sample is older than this is failing"
    )
    timeout_s: float = Field(default=1.0, gt=0, le=30, description="how long one query may take")


class Discovery(Model):
    """Where the members are found besides ``endpoints`` (Kubernetes' rolling updates and autoscaling)."""

    dns: DnsDiscovery | None = Field(default=None, description="a headless Service's DNS records")
    prometheus: PrometheusDiscovery | None = Field(
        default=None,
        description="the members' load read from Prometheus instead of scraping each one",
    )


class LocalCost(Model):
    """What the on-prem cluster costs whether it is busy or not: the price of its GPUs by the hour
    (amortised purchase, power, space, operations), so a local request has a price as a cloud one
    has, and bursting can be weighed against buying GPUs for the peak."""

    gpus: int = Field(default=0, ge=0, description="GPUs serving the cluster (0: on-prem cost unknown)")
    usd_per_gpu_hour: float = Field(default=0.0, ge=0, description="what one of them costs an hour")

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.usd_per_gpu_hour


class LocalHealth(Model):
    """When the cluster itself fails (its answers 5xx, timed out or refused), as a breaker per
    model: requests that may leave then go to the cloud targets and on-prem-only ones get 503 with
    Retry-After at once. Missing metrics alone never open it (they keep everything local)."""

    failures_to_open: int = Field(
        default=3, ge=1, description="failed local answers in a row that open it (one while metrics refuse)"
    )
    failure_rate: float = Field(default=0.5, gt=0, le=1, description="or this share of failed answers ...")
    window: int = Field(default=20, ge=2, description="... over this many of the last answers")
    open_s: float = Field(default=2.0, gt=0, description="open this long before a probe goes local")
    max_open_s: float = Field(default=30.0, gt=0, description="each reopening doubles open_s up to this")
    probes: int = Field(default=1, ge=1, description="probes in flight at once while half-open")
    successes_to_close: int = Field(
        default=2, ge=1, description="probes answered in a row that bring traffic home (hysteresis)"
    )

    @model_validator(mode="after")
    def _ordered(self) -> LocalHealth:
        if self.max_open_s < self.open_s:
            raise ValueError(
                f"local.health.max_open_s ({self.max_open_s}) is below open_s ({self.open_s}): "
                "raise max_open_s or lower open_s"
            )
        return self


class LocalCluster(Model):
    """The on-prem Triton cluster: where requests go while it meets its latency target."""

    endpoints: list[LocalEndpoint] = Field(default_factory=list, description="every on-prem Triton to scrape")
    discovery: Discovery = Field(
        default_factory=Discovery, description="members found where Kubernetes publishes them, with endpoints"
    )
    latency_target_ms: float = Field(default=200.0, gt=0, description="default p50 latency target")
    model_latency_targets_ms: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="per-model targets"
    )
    model_ttft_targets_ms: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="per-model targets for the time to the first token (an LLM's generate_stream), "
        "held against what the gateway sees the cluster take to its answers' first byte",
    )
    parallelism: int = Field(
        default=1,
        ge=1,
        description="requests the cluster runs at once per model, all its endpoints answering",
    )
    member_parallelism: Annotated[float, Field(gt=0)] | Literal["model_config"] | None = Field(
        default=None,
        description="requests one member runs at once per model (instances x what one runs at once): "
        "capacity is this times the members that answer; model_config: each member's instances of "
        "each model, read from its own configuration (GET /v2/models/<model>/config: instance_group "
        "counts x GPUs); unset: parallelism times their share",
    )
    drop_member_after_s: float = Field(
        default=1.0, gt=0, description="a member whose metrics fail this long stops counting as capacity"
    )
    scrape_period_s: float = Field(default=0.25, gt=0, le=10, description="metrics scrape period")
    stale_after_s: float = Field(default=2.0, gt=0, description="signals older than this are missing")
    max_queue_ms: float = Field(
        default=5000.0, gt=0, description="past this local wait, shed instead of queueing"
    )
    cost: LocalCost = Field(default_factory=LocalCost, description="what the cluster costs an hour")
    thresholds: Thresholds = Field(
        default_factory=Thresholds,
        description="gauges (GPU utilisation, GPU memory, any other) past whose limit the cluster overflows",
    )
    health: LocalHealth = Field(default_factory=LocalHealth, description="when the cluster counts as failing")

    def member_addresses(self) -> tuple[dict[str, str], int | None]:
        """How APISIX names a member it sent a request to (``$upstream_addr``, ``host:port``): each
        listed endpoint's metrics URL to its inference address; and the inference port of the
        members DNS discovery finds by address (SRV targets and Prometheus' members are known by
        their host alone)."""
        listed = {e.metrics_url: urlsplit(e.url).netloc.lower() for e in self.endpoints}
        dns = self.discovery.dns
        return listed, dns.port if dns is not None and dns.record != "SRV" else None

    @model_validator(mode="after")
    def _capacity_per_member(self) -> LocalCluster:
        dns, prometheus = self.discovery.dns, self.discovery.prometheus
        if self.member_parallelism == "model_config" and (prometheus or (dns and dns.record == "SRV")):
            raise ValueError(
                "local.member_parallelism: model_config reads each member's model configuration from "
                "its inference port, which local.discovery's "
                f"{'Prometheus members' if prometheus else 'SRV records'} do not give: set a number "
                "(what one member runs at once per model), or discover the members by A/AAAA records"
            )
        found = dns or prometheus
        if found is not None and self.member_parallelism is None:
            raise ValueError(
                "local.discovery finds the members, so their number is not the config's: set "
                "local.member_parallelism, what one member runs at once per model (its instance_group "
                "count), for the capacity to follow them"
            )
        return self
