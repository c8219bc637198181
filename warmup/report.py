"""What a warm-up round found: per-target counts for people, JSON for machines, and a Prometheus
text file from which the gateway learns which instances are warm and what the pings cost."""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from functions.contract import PROVISIONED_METRIC, WARM_INSTANCE_METRIC, WARMUP_SPEND_METRIC
from warmup.pinger import TargetResult

log = logging.getLogger("spillway.warmup")
SPEND_HELP = (
    "Estimated spend of the warm-up pings sent, each a billed request holding its instance for "
    "dwell_ms; counted across rounds by the warm-up process (not pings sent by cloud schedulers)."
)


def summary(result: TargetResult) -> dict[str, Any]:
    init = result.init_ms
    return {
        "target": result.target,
        "wanted": result.wanted,
        "warm": len(result.warm),
        "cold": len(result.cold),
        "pings": result.pings,
        "failed_pings": result.failed,
        "waves": result.waves,
        "ok": result.ok,
        "provisioned": result.provisioned,
        "init_ms_max": round(max(init), 1) if init else None,
        "errors": result.errors[:5],
    }


def line(result: TargetResult) -> str:
    s = summary(result)
    if result.provisioned:
        text = f"{s['target']}: {s['warm']}/{s['wanted']} warm (provisioned concurrency allocated)"
        if s["errors"]:
            text += f"; {s['errors'][0]}"
        return ("ok    " if s["ok"] else "SHORT ") + text
    text = (
        f"{s['target']}: {s['warm']}/{s['wanted']} warm ({s['cold']} were cold"
        + (f", slowest init {s['init_ms_max']} ms" if s["init_ms_max"] else "")
        + f"), {s['failed_pings']} failed pings in {s['waves']} wave(s)"
    )
    if s["errors"]:
        text += f"; first error: {s['errors'][0]}"
    return ("ok    " if s["ok"] else "SHORT ") + text


class _Spent:
    """The spend counter, at the values the rounds added up (a counter without ``_created``: its
    start is when the report file began, not when this round wrote it)."""

    def __init__(self, spent_usd: Mapping[str, float]) -> None:
        self.spent_usd = spent_usd

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(WARMUP_SPEND_METRIC, SPEND_HELP, labels=["target"])
        for target, usd in sorted(self.spent_usd.items()):
            family.add_metric([target], usd)
        yield family


def spent_before(path: Path) -> dict[str, float]:
    """Each target's spend counter as the last report left it; nothing (a counter reset, which
    Prometheus reads as one) when the file is missing or unreadable."""
    try:
        return read_spent(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        log.warning("cannot read the last warm-up report %s (%s); warm-up spend counts from zero", path, exc)
        return {}


def read_spent(text: str) -> dict[str, float]:
    """Target → spend counter, from a report's text; a value that no counter can hold is refused."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{WARMUP_SPEND_METRIC}_total" and "target" in sample.labels:
                if not math.isfinite(sample.value) or sample.value < 0:
                    raise ValueError(f"{sample.name}{sample.labels} is {sample.value}, not a spend")
                found[sample.labels["target"]] = sample.value
    return found


def added_up(before: Mapping[str, float], this_round: Mapping[str, float]) -> dict[str, float]:
    """The counters after this round: the targets of this round only (one no longer warmed is no
    longer reported)."""
    return {target: before.get(target, 0.0) + usd for target, usd in this_round.items()}


def prometheus_text(
    results: Iterable[TargetResult], spent_usd: Mapping[str, float] | None = None, now: float | None = None
) -> bytes:
    """The report; ``spent_usd``: each target's spend counter, this round's pings included."""
    return generate_latest(registry(results, spent_usd, now))


def registry(
    results: Iterable[TargetResult], spent_usd: Mapping[str, float] | None, now: float | None
) -> CollectorRegistry:
    """The report's families, filled from the round's results."""
    registry = CollectorRegistry()
    registry.register(_Spent(spent_usd or {}))
    warm = Gauge(
        "spillway_warmup_warm_instances",
        "Distinct warm instances the last round reached.",
        ["target"],
        registry=registry,
    )
    wanted = Gauge(
        "spillway_warmup_wanted_instances",
        "Instances the last round tried to keep warm.",
        ["target"],
        registry=registry,
    )
    cold = Gauge(
        "spillway_warmup_cold_instances",
        "Instances the last round found cold.",
        ["target"],
        registry=registry,
    )
    failed = Gauge(
        "spillway_warmup_failed_pings",
        "Pings of the last round that got no report.",
        ["target"],
        registry=registry,
    )
    instance = Gauge(
        WARM_INSTANCE_METRIC,
        "1 for each instance the last round found warm.",
        ["target", "instance"],
        registry=registry,
    )
    provisioned = Gauge(
        PROVISIONED_METRIC,
        "Instances the target's provisioned concurrency holds allocated (it names none of them).",
        ["target"],
        registry=registry,
    )
    stamp = Gauge(
        "spillway_warmup_last_round_timestamp_seconds", "When the last round ended.", registry=registry
    )
    for r in results:
        warm.labels(r.target).set(len(r.warm))
        wanted.labels(r.target).set(r.wanted)
        cold.labels(r.target).set(len(r.cold))
        failed.labels(r.target).set(r.failed)
        if r.provisioned:
            provisioned.labels(r.target).set(len(r.warm))
            continue
        for instance_id in r.warm:
            instance.labels(r.target, instance_id).set(1)
    stamp.set(now if now is not None else time.time())
    return registry


def write_atomically(path: Path, data: bytes) -> None:
    """Readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def to_json(results: Iterable[TargetResult]) -> str:
    return json.dumps({"event": "round", "targets": [summary(r) for r in results]})
