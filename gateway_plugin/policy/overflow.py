"""When a request that may leave should: the local load estimate, the headroom kept for
on-prem-only traffic, hysteresis, saturation, and when a cold start is worth its price.

Pure functions of a ``LocalLoad`` and the ``Policy`` (``policy.decide`` holds both types and
calls these); ``apisix/plugins/spillway/overflow.lua`` computes the same on the fast path. The
gauges of ``local.thresholds`` have their own hysteresis (``gauges_hot``), applied at each scrape:
a load carries its verdict, which the fast path's table carries as a flag.

Why the headroom: requests that may not leave have nowhere else to go. A cluster kept full by
requests that could have left makes every on-prem-only request behind them queue, miss or be
shed. So the latency at which requests that may leave spill is lowered by the queueing that the
on-prem-only arrivals alone would cause (their utilisation rho of the cluster, measured from the
arrivals the gateway sees): ``onprem_headroom`` x rho / (1 - rho) service times, spread over the
cluster's capacity. As that load nears the cluster's capacity, every request that may leave
spills.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway_plugin.policy.model import Policy
    from gateway_plugin.policy.snapshot import LocalLoad, Threshold

# Triton reports a few microseconds of queue time even for requests that never waited.
IDLE_QUEUE_SHARE = 0.1
# A model with a first-token target holds its wait's 90th percentile to it, taking the wait as
# exponential with the estimate's mean (ln 10 times it): a request queued behind streams waits
# for the soonest of them to end, and stream lengths spread so wide that the mean says little of
# the requests that miss.
WAIT_TAIL = math.log(10)


def capacity(load: LocalLoad, policy: Policy) -> float:
    """Requests the cluster runs at once: the members that answer now (a rolling update, an
    autoscaler), or the policy's ``parallelism`` where the load does not say."""
    return load.capacity if load.capacity > 0 else policy.parallelism


def scraped_latency_ms(load: LocalLoad, policy: Policy) -> float:
    """Wait behind the queue plus service time, from the scrape and what the gateway sent since.

    The wait is the larger of what Triton measured and the backlog: requests pending at the
    scrape plus those the gateway sent since, less what the cluster finished in the meantime,
    spread over its parallelism. While the cluster queues, what the gateway itself recently saw it
    take to answer (``observed_ms``) is a floor: it includes what Triton's own metrics do not (its
    HTTP front, a busy host). Once nothing is left waiting and Triton's queue time is a sliver of
    its compute time (it reports some microseconds even for requests that never waited), that
    floor (which only local answers lower, and few are local while spilling) no longer holds a
    drained cluster busy.
    """
    backlog = _backlog(load, policy)
    modelled = max(load.queue_ms, backlog * load.compute_ms / capacity(load, policy)) + load.compute_ms
    drained = backlog == 0 and load.pending == 0 and load.queue_ms <= IDLE_QUEUE_SHARE * load.compute_ms
    return modelled if drained else max(modelled, load.observed_ms)


def _backlog(load: LocalLoad, policy: Policy) -> float:
    """Requests pending at the scrape plus those the gateway sent since, less what the cluster
    finished in the meantime at full speed."""
    backlog = float(load.pending + load.sent_since_scrape)
    if load.compute_ms > 0:
        backlog = max(0.0, backlog - load.age_ms * capacity(load, policy) / load.compute_ms)
    return backlog


def backlog_ms(load: LocalLoad, policy: Policy) -> float:
    """The scrape's backlog as a latency (no measured queue time, no observed floor): what a count
    of this gateway's own requests cannot see of other gateways'."""
    return _backlog(load, policy) * load.compute_ms / capacity(load, policy) + load.compute_ms


def own_latency_ms(in_flight: int, compute_ms: float, parallelism: float) -> float:
    """What a request sent now would take by the gateway's own count of requests at the cluster:
    it waits for all but ``parallelism - 1`` of them to finish, one service time per
    ``parallelism``. The gateway counts exactly, between scrapes too."""
    return max(0, in_flight - parallelism + 1) * compute_ms / parallelism + compute_ms


def estimated_latency_ms(load: LocalLoad, policy: Policy) -> float:
    """Where the gateway counts what it has at the cluster (``in_flight`` not negative), the larger
    of that count's estimate and the scrape's backlog (which holds other gateways' requests too);
    else the scrape's estimate. With a count, Triton's measured queue time and the answer times
    the gateway saw are left out: both describe requests already answered, and a count that is
    exact between scrapes makes them only late."""
    if load.in_flight < 0 or load.compute_ms <= 0:
        return scraped_latency_ms(load, policy)
    return max(
        own_latency_ms(load.in_flight, load.compute_ms, capacity(load, policy)), backlog_ms(load, policy)
    )


def onprem_reserve_ms(load: LocalLoad, policy: Policy) -> float:
    """The local latency kept free for on-prem-only requests (infinite once their utilisation
    reaches the cluster's capacity)."""
    if load.compute_ms <= 0 or load.onprem_rps <= 0 or policy.onprem_headroom <= 0:
        return 0.0
    rho = load.onprem_rps * load.compute_ms / 1000 / capacity(load, policy)
    if rho >= 1:
        return math.inf
    return policy.onprem_headroom * load.compute_ms / capacity(load, policy) * rho / (1 - rho)


def gauges_hot(gauges: Sequence[float | None], thresholds: Sequence[Threshold], was: bool) -> bool:
    """The thresholds' own hysteresis, beside the latency's: hot once a gauge passes its limit,
    cool once every gauge is below its exit limit, else as it was. A gauge not reported neither
    starts nor holds it. Gauges change only with a scrape, so the tracker applies this there."""
    if any(v is not None and v > t.enter for t, v in zip(thresholds, gauges, strict=False)):
        return True
    if all(v is None or v < t.exit for t, v in zip(thresholds, gauges, strict=False)):
        return False
    return was


def overflowing(load: LocalLoad, target_ms: float, policy: Policy, latency_ms: float | None = None) -> bool:
    """Hysteresis on the latency plus the on-prem-only headroom: enter above target x
    enter_ratio, leave below target x exit_ratio, else keep."""
    latency = estimated_latency_ms(load, policy) if latency_ms is None else latency_ms
    need = latency + onprem_reserve_ms(load, policy)
    if need > target_ms * policy.enter_ratio:
        return True
    if need < target_ms * policy.exit_ratio:
        return False
    return load.overflowing


def saturated(load: LocalLoad, latency_ms: float, policy: Policy) -> bool:
    """Past ``max_queue_ms`` of wait or ``saturation_ratio`` x the target: a request kept local
    would wait for nothing, and one that may not leave is shed (503, Retry-After)."""
    return (
        latency_ms - load.compute_ms > policy.max_queue_ms
        or latency_ms > policy.latency_target_ms * policy.saturation_ratio
    )
