"""What a warm-up round found: per-target counts for people, JSON for machines, and a Prometheus
text file from which the gateway learns which instances are warm."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from functions.contract import WARM_INSTANCE_METRIC
from warmup.pinger import TargetResult


def summary(result: TargetResult) -> dict[str, Any]:
    init = result.init_ms
    return {
        "target": result.target,
        "wanted": result.wanted,
        "warm": len(result.warm),
        "cold": len(result.cold),
        "failed_pings": result.failed,
        "waves": result.waves,
        "ok": result.ok,
        "init_ms_max": round(max(init), 1) if init else None,
        "errors": result.errors[:5],
    }


def line(result: TargetResult) -> str:
    s = summary(result)
    text = (
        f"{s['target']}: {s['warm']}/{s['wanted']} warm ({s['cold']} were cold"
        + (f", slowest init {s['init_ms_max']} ms" if s["init_ms_max"] else "")
        + f"), {s['failed_pings']} failed pings in {s['waves']} wave(s)"
    )
    if s["errors"]:
        text += f"; first error: {s['errors'][0]}"
    return ("ok    " if s["ok"] else "SHORT ") + text


def prometheus_text(results: Iterable[TargetResult], now: float | None = None) -> bytes:
    registry = CollectorRegistry()
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
    stamp = Gauge(
        "spillway_warmup_last_round_timestamp_seconds", "When the last round ended.", registry=registry
    )
    for r in results:
        warm.labels(r.target).set(len(r.warm))
        wanted.labels(r.target).set(r.wanted)
        cold.labels(r.target).set(len(r.cold))
        failed.labels(r.target).set(r.failed)
        for instance_id in r.warm:
            instance.labels(r.target, instance_id).set(1)
    stamp.set(now if now is not None else time.time())
    return generate_latest(registry)


def write_atomically(path: Path, data: bytes) -> None:
    """Readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def to_json(results: Iterable[TargetResult]) -> str:
    return json.dumps({"event": "round", "targets": [summary(r) for r in results]})
