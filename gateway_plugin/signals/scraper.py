"""The scrape of each member's metrics page every period, handed to ``signals.load``'s tracker as a
round: what each member answered, or why it failed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from prometheus_client.samples import Sample

from gateway_plugin.policy.gauges import GaugeSpec, read_gauges
from gateway_plugin.signals.exposition import samples_of
from gateway_plugin.signals.load import LoadTracker, counters_of
from gateway_plugin.signals.members import Counters
from gateway_plugin.signals.model_config import read_instances

log = logging.getLogger("spillway.signals")


Fetch = Callable[[str], Awaitable[str]]
# A round: each member's counters per model, or why it could not be read.
Answers = dict[str, dict[str, Counters] | BaseException]


def refused(exc: BaseException) -> bool:
    """Whether a failed fetch was a connection refused (nothing listens: the host is down or
    restarting), however the HTTP client wrapped it; a timeout or a bad answer is not."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Scraper:
    """Scrapes every endpoint each period; a failed round leaves the tracker to go stale.

    ``fetch`` is the I/O (an HTTP GET returning the body; it raises ``OSError``, ``TimeoutError``
    or ``ValueError`` on failure); ``on_failure`` counts a failed round; ``gauges``: what
    ``local.thresholds`` reads now (``policy.gauges``; a reload may change it).
    """

    def __init__(
        self,
        tracker: LoadTracker,
        fetch: Fetch,
        urls: list[str],
        period_s: float,
        on_failure: Callable[[], None] = lambda: None,
        gauges: Callable[[], Sequence[GaugeSpec]] = tuple,
    ) -> None:
        self.tracker = tracker
        self.period_s = period_s
        self._fetch = fetch
        self.urls = urls
        self._on_failure = on_failure
        self._gauges = gauges

    async def scrape_once(self) -> bool:
        """One round over every member; False when none answered. The tracker is told the cluster
        refuses only when every member does (one node down is the route's health checks'
        business, and a member the round drops, not a sign the cluster is)."""
        answers, samples = await self.collect()
        applied = self.apply(answers, samples)
        if self.tracker.from_model_config and (wanted := self.tracker.members.unread()):
            self.tracker.members.read(await read_instances(self._fetch, wanted))
        return applied

    def apply(self, answers: Answers, samples: list[list[Sample]]) -> bool:
        """Hand a round to the tracker; False (counted) when no member answered."""
        failures = [a for a in answers.values() if isinstance(a, BaseException)]
        every = bool(failures) and len(failures) == len(answers)
        self.tracker.refused = every and all(map(refused, failures))
        if not self.tracker.round(answers, read_gauges(samples, self._gauges())):
            self._on_failure()
            return False
        return True

    async def collect(self) -> tuple[Answers, list[list[Sample]]]:
        """Each member's counters (or why its page could not be read), and every page's samples."""
        urls = list(self.urls)
        results = await asyncio.gather(*(self._fetch(url) for url in urls), return_exceptions=True)
        answers: Answers = {}
        samples = []
        for url, result in zip(urls, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, OSError | TimeoutError | ValueError):
                    raise result
                answers[url] = result
                continue
            try:
                sample = samples_of(str(result))
            except ValueError as exc:
                answers[url] = exc
                continue
            samples.append(sample)
            answers[url] = counters_of(sample)
        return answers, samples

    async def run(self) -> None:
        while True:
            try:
                await self.scrape_once()
            except Exception:  # the loop must outlive any one bad round; the signals then go stale
                self._on_failure()
                log.exception("metrics scrape failed unexpectedly")
            await asyncio.sleep(self.period_s)
