"""Requests and estimated spend per tenant, model and target as Prometheus series that stay bounded
whatever names clients send.

A bill per tenant and per model needs their names in labels, and clients choose both (the tenant
header, the model in the path). So a name gets its own series only when it earns one: tenants
among the heaviest spenders (at most ``metrics.tenant_series`` of them), models the cluster
reports or the config names and among the heaviest (at most ``metrics.model_series``); everything
else is counted under ``other``, so the totals stay exact. A name once given a series keeps it for
the runner's life (a counter that moved to ``other`` would read as a reset), so the labelled ones
are the first to reach the top. The heaviest are found with a Space-Saving sketch of
``SKETCH_FACTOR`` x N names (Metwally et al.): every name that holds at least 1/N of the weight seen
so far is in it, and the sketch is bounded too.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from gateway_plugin.policy.model import LOCAL, SHED

OTHER = "other"
NONE = "none"
# Stands for a name that is known to be there but not which (the fast path's overflow entry): a
# tab is in no tenant key and no model name, and it always counts as other.
UNNAMED = "\t"
SKETCH_FACTOR = 4
# A label value as it may be shown anywhere (a legend, a CSV cell): short, no markup, no quotes.
_PLAIN = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")


def label_value(name: str) -> str:
    """A name as a label shows it: itself when plain, else ``sha256:`` and 16 hex digits of it;
    never ``other`` or ``none``, which are the buckets'."""
    if _PLAIN.fullmatch(name) and name not in (OTHER, NONE):
        return name
    return "sha256:" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]


class TopLabels:
    """Which names have their own series: at most ``size``, each the first time its estimated
    weight holds at least 1/``size`` of all weight seen; ``eligible`` may rule names out."""

    def __init__(self, size: int, eligible: Callable[[str], bool] | None = None) -> None:
        self.size = size
        self.eligible = eligible
        self.total = 0.0
        self._labels: dict[str, str] = {}
        self._sketch: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._labels)

    @property
    def sketched(self) -> int:
        return len(self._sketch)

    def label(self, name: str | None, weight: float) -> str:
        if name is None:
            return NONE
        given = self._labels.get(name)
        if given is not None:
            return given
        if (
            name == UNNAMED
            or len(self._labels) >= self.size
            or (self.eligible is not None and not self.eligible(name))
        ):
            return OTHER
        self.total += weight
        estimate = self._count(name, weight)
        if estimate * self.size < self.total:
            return OTHER
        del self._sketch[name]
        given = self._labels[name] = label_value(name)
        return given

    def _count(self, name: str, weight: float) -> float:
        """Space-Saving: a name not in a full sketch takes the place of the lightest, inheriting
        its count (so no estimate is ever below the true weight)."""
        sketch = self._sketch
        if name in sketch:
            sketch[name] += weight
            return sketch[name]
        if len(sketch) >= SKETCH_FACTOR * self.size:
            lightest = min(sketch, key=sketch.__getitem__)
            weight += sketch.pop(lightest)
        sketch[name] = weight
        return weight


class CostSeries:
    """``spillway_requests_total`` and ``spillway_spend_usd_total`` by tenant, model and target, and
    what the on-prem cluster has cost (``spillway_local_cost_usd_total``). Several runners (gateways,
    workers) each count ``share`` of the cluster's cost, so their sum is the cluster's."""

    def __init__(self, registry: CollectorRegistry, tenants: int, models: int) -> None:
        self.requests = Counter(
            "spillway_requests",
            "Requests decided, by tenant, model and target (local, or a cloud target); names without "
            "their own series are counted as other, requests without a tenant as none.",
            ["tenant", "model", "target"],
            registry=registry,
        )
        self.spend = Counter(
            "spillway_spend_usd",
            "Estimated cloud spend, by tenant, model and target (the sum over them is "
            "spillway_cloud_spend_usd_total).",
            ["tenant", "model", "target"],
            registry=registry,
        )
        self.local_cost = Counter(
            "spillway_local_cost_usd",
            "What the on-prem cluster has cost since the runner started (local.cost: GPUs x price an "
            "hour, busy or not).",
            registry=registry,
        )
        self.tenants = TopLabels(tenants)
        self.models = TopLabels(models)
        self.share = 1.0
        self._children: dict[tuple[str, str, str], tuple[Counter, Counter]] = {}
        self._accrued_at: float | None = None
        self._local_usd = 0.0
        self._local_requests = 0

    def accrue(self, now: float, usd_per_hour: float) -> None:
        """The cluster's cost since the last call, ``now`` on a monotonic clock."""
        if self._accrued_at is not None and usd_per_hour > 0:
            usd = max(0.0, now - self._accrued_at) / 3600 * usd_per_hour * self.share
            self._local_usd += usd
            self.local_cost.inc(usd)
        self._accrued_at = now

    def counted(self, tenant: str | None, model: str | None, target: str, count: int, usd: float) -> None:
        """Requests decided for a tenant and model (shed ones cost nothing). Local ones weigh what
        the cluster has cost per local request so far."""
        if target == SHED or count <= 0:
            return
        if target == LOCAL:
            self._local_requests += count
            self.add(tenant, model, target, count, 0.0, self._local_usd / self._local_requests * count)
        else:
            self.add(tenant, model, target, count, usd, usd)

    def resize(self, tenants: int, models: int) -> None:
        """A reload may give more names a series (never fewer: those given keep theirs)."""
        self.tenants.size = max(tenants, len(self.tenants))
        self.models.size = max(models, len(self.models))

    def add(
        self, tenant: str | None, model: str | None, target: str, count: int, usd: float, weight: float
    ) -> None:
        """``count`` requests to ``target`` costing ``usd`` (cloud); ``weight`` ranks them (what they
        cost, a local one priced as the cluster's share of an hour)."""
        key = (self.tenants.label(tenant, weight), self.models.label(model or None, weight), target)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = (self.requests.labels(*key), self.spend.labels(*key))
        child[0].inc(count)
        if usd > 0:
            child[1].inc(usd)
