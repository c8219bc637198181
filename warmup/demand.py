"""The overflow each target took recently, read from the gateway's own Prometheus endpoint."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import requests
from prometheus_client.parser import text_string_to_metric_families


def decisions_by_target(text: str) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        if family.name != "spillway_decisions":
            continue
        for sample in family.samples:
            if sample.name == "spillway_decisions_total":
                totals[sample.labels["target"]] += sample.value
    return dict(totals)


def http_get(url: str, timeout_s: float = 5.0) -> str:
    """The page at ``url``; raises ``requests.RequestException``."""
    return requests.get(url, timeout=timeout_s).text


def overflow_rates(
    metrics_url: str,
    sample_s: float,
    get: Callable[[str], str] = http_get,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, float]:
    """Decisions per second per target over ``sample_s``, from two reads of the gateway's metrics."""
    first = decisions_by_target(get(metrics_url))
    start = clock()
    sleep(sample_s)
    second = decisions_by_target(get(metrics_url))
    elapsed = clock() - start
    return {t: max(0.0, (second.get(t, 0.0) - first.get(t, 0.0)) / elapsed) for t in second}
