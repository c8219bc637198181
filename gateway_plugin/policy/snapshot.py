"""What one request's decision reads: the request's features and the gateway's state, as
immutable tuples (``policy.decide`` decides from them; the runner, the fast path's table and the
simulator build them).

Immutable tuples, which cost a fifth of what frozen dataclasses cost to make: one is built for
every request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, NamedTuple

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class RequestFeatures(NamedTuple):
    """What the policy may know of a request; built at the edge from the APISIX call.

    ``body_bytes`` is the body's declared size (Content-Length); None when it is not known (a
    chunked body), which no target with a size limit takes.
    """

    path: str
    headers: Mapping[str, str]
    args: Mapping[str, str] = _EMPTY
    model: str | None = None
    body_bytes: int | None = 0


class LocalLoad(NamedTuple):
    """The on-prem cluster's state for one model, from Triton's metrics and the gateway's own count.

    ``in_flight``: the requests the gateway has at the cluster now, as it counts them (negative:
    it keeps no count); ``onprem_rps``: the rate at which requests that may not leave arrive;
    ``overflowing``: the latency's hysteresis state; ``gauges_hot``: the thresholds' own (a gauge
    of ``local.thresholds`` past its limit and none yet below its exit), applied at each scrape;
    ``failing``: the cluster's own breaker is not closed (its answers fail), ``probe_allowed``:
    half-open, a request may go local to probe it; ``capacity``: requests the members that answer
    run at once (0: the policy's ``parallelism``).
    """

    fresh: bool = False
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    pending: int = 0
    sent_since_scrape: int = 0
    age_ms: float = 0.0
    overflowing: bool = False
    observed_ms: float = 0.0
    in_flight: int = -1
    onprem_rps: float = 0.0
    gauges_hot: bool = False
    failing: bool = False
    probe_allowed: bool = False
    capacity: float = 0.0


class Threshold(NamedTuple):
    """A gauge's limits (``local.thresholds``): past ``enter`` the cluster overflows; below ``exit``
    it may stop (``policy.overflow.gauges_hot``)."""

    name: str
    enter: float
    exit: float


class TargetState(NamedTuple):
    """One target as the gateway sees it; ``starting``: the requests in flight that were sent
    there cold (each starting an instance, or on a warm one the gateway had not learnt of), so
    ``in_flight - starting`` of them occupy the warm instances it knows; ``idle_s``: since an answer
    last came from one of its instances (infinite when none is known)."""

    breaker: BreakerState = BreakerState.CLOSED
    probe_allowed: bool = False
    in_flight: int = 0
    warm_instances: int = 0
    spent_hour_usd: float = 0.0
    spent_day_usd: float = 0.0
    starting: int = 0
    idle_s: float = math.inf


class TenantState(NamedTuple):
    requests_last_minute: int = 0
    in_flight: int = 0
    spent_hour_usd: float = 0.0
    spent_day_usd: float = 0.0


class Snapshot(NamedTuple):
    local: Mapping[str, LocalLoad] = _EMPTY
    targets: Mapping[str, TargetState] = _EMPTY
    tenants: Mapping[str, TenantState] = _EMPTY
