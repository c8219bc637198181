"""The overflow each target took recently, read from the gateway's own Prometheus endpoint."""

from __future__ import annotations

import time
from collections import defaultdict

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


def overflow_rates(metrics_url: str, sample_s: float, timeout_s: float = 5.0) -> dict[str, float]:
    """Decisions per second per target over ``sample_s``; raises ``requests.RequestException``."""
    first = decisions_by_target(requests.get(metrics_url, timeout=timeout_s).text)
    start = time.monotonic()
    time.sleep(sample_s)
    second = decisions_by_target(requests.get(metrics_url, timeout=timeout_s).text)
    elapsed = time.monotonic() - start
    return {t: max(0.0, (second.get(t, 0.0) - first.get(t, 0.0)) / elapsed) for t in second}
