"""The bill counts the warm-up's pings once, however many runners show the warm-up's counter: each
summary's parts sum to its total, from one runner's /metrics and from Prometheus. Prometheus here
is a stand-in for its HTTP API that answers the bill's queries from two runners' raw samples (the
subquery evaluated as Prometheus does: each series' last sample within five minutes of a step,
the highest per target); tests/integration/test_monitoring.py runs the bill against a real one."""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway_plugin import bill
from testing.http import QuietHandler, http_server_thread

START = datetime(2024, 1, 1, 10, tzinfo=UTC)
END = datetime(2024, 1, 1, 12, tzinfo=UTC)
T0, T1 = START.timestamp(), END.timestamp()
FIRST_ROUND = T0 - 3700  # the warm-up ran before the period began, and goes on through it
ROUND_S, ROUND_USD = 240, 0.1
LOOKBACK_S = 300  # Prometheus' lookback for an instant vector
GPUS, USD_PER_GPU_HOUR, PEAK_RPS, LOCAL_PEAK_RPS = 2, 3.0, 10.0, 5.0
Series = tuple[dict[str, str], list[tuple[float, float]]]


def _warmup_counter(at: float) -> float:
    return ROUND_USD * (math.floor((at - FIRST_ROUND) / ROUND_S) + 1) if at >= FIRST_ROUND else 0.0


def _runner(instance: str, lag_s: float, aws_per_min: float) -> dict[str, list[Series]]:
    """One runner's series, scraped every minute; it reads the warm-up's report ``lag_s`` after
    the warm-up writes it."""
    times = [T0 - 3600 + 60 * i for i in range(181)]

    def counter(per_min: float) -> list[tuple[float, float]]:
        return [(at, per_min * i) for i, at in enumerate(times)]

    def series(per_min: float, **labels: str) -> Series:
        return {"instance": instance, **labels}, counter(per_min)

    return {
        bill.REQUESTS: [
            series(aws_per_min, tenant="a", model="m", target="aws"),
            series(3.0, tenant="a", model="m", target="local"),
        ],
        bill.SPEND: [series(aws_per_min / 100, tenant="a", model="m", target="aws")],
        bill.LOCAL_COST: [series(0.05)],
        bill.WARMUP_SPEND: [
            ({"instance": instance, "target": "aws"}, [(at, _warmup_counter(at - lag_s)) for at in times])
        ],
    }


RUNNERS = (_runner("a:9092", 0.0, 1.0), _runner("b:9092", 2.0, 2.0))


def _matrix(result: list[Series]) -> dict[str, Any]:
    values = [{"metric": labels, "values": [[at, str(v)] for at, v in points]} for labels, points in result]
    return {"status": "success", "data": {"resultType": "matrix", "result": values}}


def _scalar(value: float, at: float) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {}, "value": [at, str(value)]}]},
    }


def _raw(name: str, range_s: int, at: float) -> list[Series]:
    found = []
    for runner in RUNNERS:
        for labels, points in runner[name]:
            found.append((labels, [(t, v) for t, v in points if at - range_s < t <= at]))
    return found


def _highest_per_target(name: str, range_s: int, step_s: int, at: float) -> list[Series]:
    merged: dict[str, list[tuple[float, float]]] = {}
    step = math.ceil((at - range_s) / step_s) * step_s
    while step <= at:
        latest: dict[str, float] = {}
        for runner in RUNNERS:
            for labels, points in runner[name]:
                seen = [v for t, v in points if step - LOOKBACK_S < t <= step]
                if seen:
                    latest[labels["target"]] = max(latest.get(labels["target"], seen[-1]), seen[-1])
        for target, value in latest.items():
            merged.setdefault(target, []).append((step, value))
        step += step_s
    return [({"target": target}, points) for target, points in merged.items()]


def answer(query: str, at: float) -> dict[str, Any]:
    """What Prometheus answers to each query the bill sends; anything else is refused."""
    if found := re.fullmatch(r"(\w+)\[(\d+)s\]", query):
        return _matrix(_raw(found[1], int(found[2]), at))
    if found := re.fullmatch(r"max by \(target\) \((\w+)\)\[(\d+)s:(\d+)s\]", query):
        return _matrix(_highest_per_target(found[1], int(found[2]), int(found[3]), at))
    canned = {
        'target!="shed"': PEAK_RPS,
        'target="local"': LOCAL_PEAK_RPS,
        bill.GPUS: GPUS,
        bill.GPU_PRICE: GPUS * USD_PER_GPU_HOUR,
    }
    for part, value in canned.items():
        if query.startswith("max") and part in query:
            return _scalar(value, at)
    return {"status": "error", "error": f"the stand-in does not answer {query!r}"}


@pytest.fixture
def prometheus() -> Iterator[str]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            params = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            self.reply(json.dumps(answer(params["query"][0], float(params["time"][0]))).encode())

    with http_server_thread(Handler) as url:
        yield url


def _parts_sum_to_totals(summary: dict[str, Any]) -> None:
    assert summary["cloud_usd"] == pytest.approx(summary["routed_usd"] + summary["warmup_usd"])
    assert summary["total_usd"] == pytest.approx(summary["cloud_usd"] + summary["onprem_usd"])
    assert summary["usd_per_1000_requests"] * summary["requests"] / 1000 == pytest.approx(
        summary["total_usd"]
    )


def test_from_prometheus_the_warmup_counts_once_per_target_and_the_parts_sum(prometheus: str) -> None:
    made = bill.from_prometheus(prometheus, START, END)
    rounds = sum(1 for k in range(100) if T0 < FIRST_ROUND + k * ROUND_S <= T1)
    summary = made.summary
    _parts_sum_to_totals(summary)
    assert summary["warmup_usd"] == pytest.approx(rounds * ROUND_USD), "two runners' copies, counted once"
    assert summary["routed_usd"] == pytest.approx(120 * 0.03)
    assert summary["onprem_usd"] == pytest.approx(120 * 0.1)
    assert summary["requests"] == pytest.approx(120 * (3 + 3 + 1 + 2))
    (warm,) = [r for r in made.rows if r.kind == bill.WARMUP_KIND]
    assert (warm.tenant, warm.model, warm.target, warm.requests) == ("", "", "aws", 0.0)
    assert {r.kind for r in made.rows if r is not warm} == {bill.REQUESTS_KIND}
    fleet = summary["peak_fleet_usd"]
    assert fleet == pytest.approx(4 * USD_PER_GPU_HOUR * 2)
    assert summary["bursting_saved_pct"] == pytest.approx(100 * (1 - summary["total_usd"] / fleet))


def test_from_metrics_the_warmup_counts_once_per_target_and_the_parts_sum() -> None:
    text = "\n".join(
        [
            'spillway_requests_total{tenant="a",model="m",target="aws"} 10',
            'spillway_requests_total{tenant="a",model="m",target="local"} 30',
            'spillway_spend_usd_total{tenant="a",model="m",target="aws"} 0.5',
            "spillway_local_cost_usd_total 2",
            # The same counter twice (two workers' copies), once per target in the bill.
            'spillway_warmup_spend_usd_total{target="aws",worker="1"} 0.25',
            'spillway_warmup_spend_usd_total{target="aws",worker="2"} 0.25',
            'spillway_warmup_spend_usd_total{target="fc"} 0.125',
            "",
        ]
    )
    made = bill.from_metrics(text)
    _parts_sum_to_totals(made.summary)
    assert made.summary["warmup_usd"] == pytest.approx(0.375)
    assert made.summary["total_usd"] == pytest.approx(0.5 + 0.375 + 2)
    assert made.summary["usd_per_1000_requests"] == pytest.approx(1000 * 2.875 / 40)
    warm = {r.target: r.cost_usd for r in made.rows if r.kind == bill.WARMUP_KIND}
    assert warm == {"aws": 0.25, "fc": 0.125}
