"""What the simulated world holds at an instant, as routers may read it, and how they are fed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gateway_plugin.policy.snapshot import RequestFeatures
from gateway_plugin.signals.members import Counters
from gateway_plugin.simulation.cloud import CloudTarget
from gateway_plugin.simulation.cluster import Cluster, Job


@dataclass
class World:
    """The true state: the cluster, the targets in chain order, and the last scraped utilisation."""

    cluster: Cluster
    clouds: Mapping[str, CloudTarget]
    latency_target_ms: float
    utilisation: float = 0.0
    features: Mapping[bool, RequestFeatures] = field(default_factory=dict)


class Router(Protocol):
    """A routing policy under simulation: where each request goes (a target, ``local`` or ``shed``)."""

    name: str
    listens: bool

    def route(self, job: Job, now: float, world: World) -> str: ...

    def scraped(
        self, counters: Counters, now: float, utilisation: float = 0.0, occupied: float = 0.0
    ) -> None:
        """A scrape: Triton's counters, the busy share of the cluster since the last one, and the
        share of its model instances running a request now."""

    def answered_local(self, ms: float, now: float, tenant: str | None = None) -> None: ...

    def answered_cloud(
        self,
        target: str,
        instance: str,
        cold: bool,
        ok: bool,
        seconds: float,
        now: float,
        tenant: str | None = None,
        tokens: int = 0,
        prompt: int = 0,
    ) -> None: ...

    def warm_report(self, target: str, instances: list[str], now: float) -> None: ...

    def returned(self, job: Job, now: float) -> None:
        """A request's answer passed the gateway (no logger's delay: the gateway sees it go by)."""

    def members_changed(self, members: int, now: float) -> None:
        """The cluster has ``members`` pods from now on (what the runner's scrapes find next)."""
