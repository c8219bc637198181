"""``python -m gateway_plugin costs``: the bill per day x tenant x model x target, and what bursting
saved against buying GPUs for the peak.

From Prometheus' HTTP API (the runners' counters as scraped, every series' raw samples, so each
day's figure is exact rather than extrapolated the way ``increase()`` is) or from one runner's
``/metrics`` (its counters since it started, one period). Each row says what it is for (``kind``).
Cloud rows of requests are the estimated spend of the requests sent there
(``spillway_spend_usd_total``); warm-up rows, one per target, the estimated spend of the warm-up's
pings (``spillway_warmup_spend_usd_total``: every runner shows the same counter, so it is taken once
per target, never summed; from one runner's /metrics it is the counter since the warm-up's report
file began, which may be longer than the runner has run). The on-prem cluster's cost
(``spillway_local_cost_usd_total``: its GPUs by the hour, busy or not) is shared among the day's
local requests in proportion to their number, and a day without any is one row with no tenant.

Bursting saved: the cluster is taken to serve at most the most local requests it served in a
``--peak-window`` (it spills only when full), so serving the busiest window at home would take
``ceil(gpus x peak / local peak)`` GPUs for the whole period; the saving is what those would have
cost less what the cluster and the clouds did.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway_plugin.costs import peak_fleet

REQUESTS, SPEND, LOCAL_COST, WARMUP_SPEND = (
    "spillway_requests_total",
    "spillway_spend_usd_total",
    "spillway_local_cost_usd_total",
    "spillway_warmup_spend_usd_total",
)
GPUS, GPU_PRICE = "spillway_local_gpus", "spillway_local_cost_usd_per_hour"
# A series' sample this long before the billed period is its baseline (one further back is not read).
LOOKBACK_S = 3600
TIMEOUT_S = 30.0
# The warm-up counter is read once per target as the highest of its copies every this many seconds.
WARMUP_STEP_S = 60
Key = tuple[str, str, str]
# What a row is for: requests (cloud or on-prem), the warm-up's pings, the cluster on a day it
# served no request.
REQUESTS_KIND, WARMUP_KIND, CLUSTER_KIND = "requests", "warmup", "cluster"


@dataclass
class Row:
    period: str
    tenant: str
    model: str
    target: str
    requests: float = 0.0
    cost_usd: float = 0.0
    kind: str = REQUESTS_KIND


@dataclass
class Bill:
    rows: list[Row] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def increase(samples: Iterable[tuple[float, float]], start: float, end: float, new: bool) -> float:
    """How much a counter grew in (start, end]: its samples in time order, a drop read as a restart
    from zero; ``new``: the series began in the data read (its first sample counts from zero)."""
    grown, last = 0.0, None
    for at, value in samples:
        if start < at <= end:
            if last is None:
                grown += value if new else 0.0
            else:
                grown += value - last if value >= last else value
        if at > end:
            break
        last = value
    return grown


def allocate(
    day: str, usage: dict[Key, list[float]], local_usd: float, warmup_usd: dict[str, float] | None = None
) -> list[Row]:
    """One day's rows: cloud ones as counted; the warm-up's per target, with no tenant or model;
    the cluster's cost shared by local requests."""
    rows = [Row(day, *key, v[0], v[1]) for key, v in sorted(usage.items()) if key[2] != "local"]
    rows += [
        Row(day, "", "", t, 0.0, usd, WARMUP_KIND) for t, usd in sorted((warmup_usd or {}).items()) if usd
    ]
    local = {key: values[0] for key, values in sorted(usage.items()) if key[2] == "local" and values[0]}
    served = sum(local.values())
    for key, count in local.items():
        rows.append(Row(day, *key, count, local_usd * count / served))
    if not served and local_usd:
        rows.append(Row(day, "", "", "local", 0.0, local_usd, CLUSTER_KIND))
    return rows


def summarise(
    rows: list[Row], hours: float, gpus: float, price: float, peak: float | None, local_peak: float | None
) -> dict[str, Any]:
    warmup = sum(r.cost_usd for r in rows if r.kind == WARMUP_KIND)
    routed = sum(r.cost_usd for r in rows if r.kind == REQUESTS_KIND and r.target != "local")
    cloud = routed + warmup
    onprem = sum(r.cost_usd for r in rows if r.target == "local")
    served = sum(r.requests for r in rows)
    summary: dict[str, Any] = {
        "requests": served,
        "cloud_usd": cloud,
        "routed_usd": routed,
        "warmup_usd": warmup,
        "onprem_usd": onprem,
        "total_usd": cloud + onprem,
        "usd_per_1000_requests": 1000 * (cloud + onprem) / served if served else None,
        "hours": hours,
        "peak_rps": peak,
        "local_peak_rps": local_peak,
        "gpus": gpus,
        "gpus_for_peak": None,
        "peak_fleet_usd": None,
        "bursting_saved_pct": None,
    }
    fleet = peak_fleet(cloud + onprem, hours, round(gpus), price, peak or 0.0, local_peak or 0.0)
    if fleet is not None and cloud > 0:
        summary |= {
            "gpus_for_peak": fleet.gpus,
            "peak_fleet_usd": fleet.usd,
            "bursting_saved_pct": fleet.saved_pct,
        }
    return summary


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=TIMEOUT_S) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise ValueError(f"Prometheus refused {expr!r}: {body.get('error')}")
        return list(body["data"]["result"])

    def samples(
        self, name: str, start: float, end: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]], bool]]:
        """Every series of ``name``: labels, raw samples from LOOKBACK_S before ``start`` to ``end``,
        and whether it began after ``start`` (no sample before it)."""
        found = []
        for series in self.query(f"{name}[{int(end - start + LOOKBACK_S)}s]", end):
            points = [(float(at), float(v)) for at, v in series["values"]]
            found.append((series["metric"], points, bool(points) and points[0][0] > start))
        return found

    def warmup_samples(self, start: float, end: float) -> dict[str, tuple[list[tuple[float, float]], bool]]:
        """The warm-up counter once per target (the highest of the runners' copies, so a runner that
        read the report later than another counts no reset) every WARMUP_STEP_S, as ``samples``
        reads a series."""
        span = f"{int(end - start + LOOKBACK_S)}s:{WARMUP_STEP_S}s"
        found = {}
        for series in self.query(f"max by (target) ({WARMUP_SPEND})[{span}]", end):
            points = [(float(at), float(v)) for at, v in series["values"]]
            found[series["metric"].get("target", "")] = (points, bool(points) and points[0][0] > start)
        return found

    def scalar(self, expr: str, at: float) -> float | None:
        result = self.query(expr, at)
        return float(result[0]["value"][1]) if result else None


def _days(start: datetime, end: datetime) -> list[tuple[str, float, float]]:
    days, day = [], start
    while day < end:
        nxt = min(datetime.combine(day.date() + timedelta(days=1), datetime.min.time(), UTC), end)
        days.append((day.date().isoformat(), day.timestamp(), nxt.timestamp()))
        day = nxt
    return days


def from_prometheus(url: str, start: datetime, end: datetime, peak_window: str = "1m") -> Bill:
    prom = Prometheus(url)
    t0, t1 = start.timestamp(), end.timestamp()
    series = {name: prom.samples(name, t0, t1) for name in (REQUESTS, SPEND, LOCAL_COST)}
    warmup = prom.warmup_samples(t0, t1)
    rows = []
    for day, a, b in _days(start, end):
        usage: dict[Key, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for position, name in enumerate((REQUESTS, SPEND)):
            for labels, points, new in series[name]:
                key = (labels.get("tenant", ""), labels.get("model", ""), labels.get("target", ""))
                usage[key][position] += increase(points, a, b, new)
        local = sum(increase(points, a, b, new) for _, points, new in series[LOCAL_COST])
        warm = {target: increase(points, a, b, new) for target, (points, new) in warmup.items()}
        rows += allocate(day, {k: v for k, v in usage.items() if v[0] or v[1]}, local, warm)
    span = f"{int(t1 - t0)}s"
    served = f'sum(rate({REQUESTS}{{target!="shed"}}[{peak_window}]))'
    local_rate = f'sum(rate({REQUESTS}{{target="local"}}[{peak_window}]))'
    peak = prom.scalar(f"max_over_time(({served})[{span}:5s])", t1)
    local_peak = prom.scalar(f"max_over_time(({local_rate})[{span}:5s])", t1)
    gpus = prom.scalar(f"max(max_over_time({GPUS}[{span}]))", t1) or 0.0
    per_hour = prom.scalar(f"max(max_over_time({GPU_PRICE}[{span}]))", t1) or 0.0
    price = per_hour / gpus if gpus else 0.0
    return Bill(rows, summarise(rows, (t1 - t0) / 3600, gpus, price, peak, local_peak))


def from_metrics(text: str, period: str = "since-start") -> Bill:
    """One runner's counters since it started (its ``/metrics``): one period, no peak."""
    usage: dict[Key, list[float]] = defaultdict(lambda: [0.0, 0.0])
    local = 0.0
    warmup: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name in (REQUESTS, SPEND):
                key = (labels.get("tenant", ""), labels.get("model", ""), labels.get("target", ""))
                usage[key][0 if sample.name == REQUESTS else 1] += sample.value
            elif sample.name == LOCAL_COST:
                local += sample.value
            elif sample.name == WARMUP_SPEND:
                target = labels.get("target", "")
                warmup[target] = max(warmup.get(target, 0.0), sample.value)
    rows = allocate(period, {k: v for k, v in usage.items() if v[0] or v[1]}, local, warmup)
    return Bill(rows, summarise(rows, 0.0, 0.0, 0.0, None, None))


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    costs = sub.add_parser(
        "costs",
        help="the bill per day x tenant x model x target, and what bursting saved",
        description="Print the estimated bill: cloud spend as the runners counted it, the warm-up's "
        "pings (once per target, rows of kind warmup), the on-prem cluster's cost (local.cost) "
        "shared among the local requests, per day, tenant, model and target; with --prometheus "
        "also what bursting saved against GPUs for the peak.",
    )
    where = costs.add_mutually_exclusive_group(required=True)
    where.add_argument("--prometheus", metavar="URL", help="Prometheus' base URL, e.g. http://127.0.0.1:9090")
    where.add_argument("--metrics-url", metavar="URL", help="one runner's /metrics (since it started)")
    costs.add_argument("--days", type=float, default=1.0, help="the period: the last N days (default 1)")
    costs.add_argument("--end", help="the period's end, ISO 8601 (default: now)")
    costs.add_argument("--peak-window", default="1m", help="the window peak rates are taken over")
    costs.add_argument("--format", choices=("csv", "json"), default="csv")


def run(args: argparse.Namespace) -> int:
    try:
        if args.prometheus:
            end = datetime.fromisoformat(args.end) if args.end else datetime.now(UTC)
            end = end if end.tzinfo else end.replace(tzinfo=UTC)
            bill = from_prometheus(args.prometheus, end - timedelta(days=args.days), end, args.peak_window)
        else:
            with urllib.request.urlopen(args.metrics_url, timeout=TIMEOUT_S) as answer:
                bill = from_metrics(answer.read().decode())
    except (OSError, ValueError) as exc:
        where = args.prometheus or args.metrics_url
        print(
            f"error: cannot read the counters from {where}: {exc}; check the URL and that it answers",
            file=sys.stderr,
        )
        return 2
    write(bill, args.format)
    return 0


def write(bill: Bill, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps({"rows": [asdict(r) for r in bill.rows], "summary": bill.summary}, indent=2))
        return
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["period", "tenant", "model", "target", "requests", "cost_usd", "kind"])
    for r in bill.rows:
        out.writerow([r.period, r.tenant, r.model, r.target, f"{r.requests:g}", f"{r.cost_usd:.6f}", r.kind])
    s, saved = bill.summary, bill.summary.get("bursting_saved_pct")
    print(
        f"# total {s['total_usd']:.4f} USD (cloud {s['cloud_usd']:.4f}, of which warm-up "
        f"{s['warmup_usd']:.4f}; on-prem {s['onprem_usd']:.4f})"
        + ("" if saved is None else f"; bursting saved {saved:.1f} %"),
        file=sys.stderr,
    )
