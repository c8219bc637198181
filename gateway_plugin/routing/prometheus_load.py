"""The on-prem members and their load read from the Prometheus that already scrapes them.

Where a cluster runs Prometheus (the Kubernetes norm, with its own discovery of the pods), the
runner need not reach every pod: one PromQL query a period returns each Triton's series, labelled
by the member that exported them (``member_label``, ``instance`` by default). A member whose ``up``
is 0, or whose newest sample is older than ``max_age_s``, is failing, and one Prometheus no longer
returns (a pod gone: its series end with a staleness marker) is gone at once. Counters move only as
often as Prometheus scrapes; the rounds between see no new work and keep the last estimate.
"""

from __future__ import annotations

import json
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Sequence

from prometheus_client.samples import Sample

from gateway_plugin.config.cluster import PrometheusDiscovery
from gateway_plugin.routing.gauges import GaugeSpec
from gateway_plugin.routing.signals import Answers, Fetch, LoadTracker, Scraper, counters_of

# Every Triton series (nv_*: counters, pending, GPU and CPU gauges) and whether its scrape answered.
NAMES = "nv_.+|up"
# Members read from one answer, at most.
MAX_MEMBERS = 1000


class PrometheusAnswerError(ValueError):
    """Prometheus answered something else than an instant vector."""


class MemberDown(OSError):
    """Prometheus could not scrape the member, or has not for too long."""


def query_url(spec: PrometheusDiscovery) -> str:
    query = f'{{__name__=~"{NAMES}",{spec.selector}}}' if spec.selector else f'{{__name__=~"{NAMES}"}}'
    return f"{spec.url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"


def read_answer(body: str, spec: PrometheusDiscovery, now: float) -> tuple[Answers, list[list[Sample]]]:
    """Each member's counters (or why it is failing) and samples, from a query's JSON answer."""
    try:
        answer = json.loads(body)
        result = answer["data"]["result"] if answer.get("status") == "success" else None
    except (ValueError, KeyError, TypeError, AttributeError):
        result = None
    if not isinstance(result, list):
        raise PrometheusAnswerError(f"Prometheus answered no instant vector: {body[:200]!r}")
    samples: dict[str, list[Sample]] = defaultdict(list)
    up: dict[str, float] = {}
    newest: dict[str, float] = defaultdict(float)
    for series in result:
        try:
            labels = {str(k): str(v) for k, v in series["metric"].items()}
            at, value = float(series["value"][0]), float(series["value"][1])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            continue
        member = labels.get(spec.member_label)
        if member is None or (member not in samples and len(samples) >= MAX_MEMBERS):
            continue
        name = labels.pop("__name__", "")
        newest[member] = max(newest[member], at)
        if name == "up":
            up[member] = value
            samples.setdefault(member, [])
        else:
            samples[member].append(Sample(name, labels, value))
    answers: Answers = {}
    for member, member_samples in samples.items():
        if up.get(member, 1.0) == 0:
            answers[member] = MemberDown(f"Prometheus cannot scrape {member} (up is 0)")
        elif now - newest[member] > spec.max_age_s:
            answers[member] = MemberDown(f"{member}'s newest sample is {now - newest[member]:.0f} s old")
        else:
            answers[member] = counters_of(member_samples)
    return answers, [s for m, s in samples.items() if not isinstance(answers[m], BaseException)]


class PrometheusScraper(Scraper):
    """A ``Scraper`` whose round is one query to Prometheus; ``wall`` is the clock its samples'
    timestamps are read against."""

    def __init__(
        self,
        tracker: LoadTracker,
        fetch: Fetch,
        spec: PrometheusDiscovery,
        period_s: float,
        wall: Callable[[], float],
        on_failure: Callable[[], None] = lambda: None,
        gauges: Callable[[], Sequence[GaugeSpec]] = tuple,
    ) -> None:
        super().__init__(tracker, fetch, [query_url(spec)], period_s, on_failure, gauges)
        self.spec = spec
        self._wall = wall

    async def collect(self) -> tuple[Answers, list[list[Sample]]]:
        try:
            body = await self._fetch(self.urls[0])
        except (OSError, TimeoutError, ValueError) as exc:
            # Prometheus unreachable: the members are unknown, not gone.
            return {self.spec.url: exc}, []
        return read_answer(body, self.spec, self._wall())
