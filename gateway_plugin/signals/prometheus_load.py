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
import logging
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import NamedTuple

from prometheus_client.samples import Sample

from gateway_plugin.config.cluster import PrometheusDiscovery
from gateway_plugin.policy.gauges import GaugeSpec
from gateway_plugin.signals.load import LoadTracker, counters_of
from gateway_plugin.signals.scraper import Answers, Fetch, Scraper

log = logging.getLogger("spillway.signals")

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


class Read(NamedTuple):
    answers: Answers
    samples: list[list[Sample]]
    # Each member's newest sample time: unchanged, Prometheus has not scraped it again.
    newest: dict[str, float]


def read_answer(body: str, spec: PrometheusDiscovery, now: float) -> Read:
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
    kept = [s for m, s in samples.items() if not isinstance(answers[m], BaseException)]
    return Read(answers, kept, dict(newest))


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
        self._newest: dict[str, float] = {}
        self._said: str | None = None

    async def scrape_once(self) -> bool:
        """A round; one whose samples are those of the last (Prometheus scrapes less often than the
        runner asks) keeps the signals fresh and changes nothing else, so the gateway's count of
        what it sent since the last new sample goes on."""
        try:
            body = await self._fetch(self.urls[0])
            read: Read | None = read_answer(body, self.spec, self._wall())
        except (OSError, TimeoutError, ValueError) as exc:
            # The members are unknown then, not gone: the signals go stale and requests stay home.
            if self._said is None:
                log.warning("cannot read the on-prem load from Prometheus: %s", exc)
            self._said, read = str(exc), None
        if read is None:
            self._on_failure()
            return False
        if self._said is not None:
            log.warning("the on-prem load is read from Prometheus again")
            self._said = None
        if read.newest and read.newest == self._newest:
            self.tracker.unchanged()
            return True
        self._newest = read.newest
        return self.apply(read.answers, read.samples)
