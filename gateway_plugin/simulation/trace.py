"""Traffic for the simulator: trace files and built-in generators, turned into arrivals.

A trace is either a text file with one arrival rate (requests/s) per line, one line per interval
(arrivals are Poisson within an interval), or a CSV with a ``timestamp`` column (seconds, one row
per request, from the first row's time; optional ``bytes``, ``classification`` and ``tenant``
columns). The generators make rate traces:
``poisson``, ``mmpp`` (a Markov-modulated process: calm and burst states with exponential
sojourns) and ``diurnal`` (a daily sine with a flash crowd), and the families shaped like published
serverless workloads (``workloads``: heavy, burst, cron, daily, sporadic, rare_bursts, flash),
each tuned by ``name:key=value,...`` (``seed`` picks another draw of a random shape).
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gateway_plugin.simulation.workloads import FAMILIES, shaped

MAX_RATE = 1_000_000.0
MAX_LINE = 4096
MAX_TENANT = 200
GENERATORS = ("poisson", "mmpp", "diurnal", *FAMILIES)


class TraceError(ValueError):
    """The trace cannot be used; the message names the file, the line and what to fix."""


class Arrival(NamedTuple):
    at_s: float
    body_bytes: int
    confidential: bool
    tenant: str | None = None
    sheddable: bool = False


@dataclass(frozen=True)
class RateTrace:
    """Arrival rates (requests/s), one per interval."""

    rates: tuple[float, ...]
    interval_s: float = 1.0

    @property
    def seconds(self) -> float:
        return len(self.rates) * self.interval_s


@dataclass(frozen=True)
class CsvTrace:
    path: Path


Trace = RateTrace | CsvTrace


@dataclass(frozen=True)
class Shaping:
    """What the command line does to a trace: scale it, cut it, label and size its requests."""

    scale: float = 1.0
    duration_s: float | None = None
    confidential_share: float = 0.0
    request_bytes: int = 16_384
    large_share: float = 0.0
    large_bytes: int = 8 * 1024 * 1024
    # Requests that carry ``admission.priority_header: sheddable`` (the rest name no priority).
    sheddable_share: float = 0.0


def load(spec: str, interval_s: float = 1.0) -> Trace:
    """A trace file, or a built-in generator (``mmpp``, ``diurnal:mean=40``, ...)."""
    path = Path(spec)
    if path.exists():
        return _load_file(path, interval_s)
    name, _, params = spec.partition(":")
    if name in GENERATORS:
        return generate(name, _params(params, spec))
    raise TraceError(f"{spec}: no such file, and not a generator (one of {', '.join(GENERATORS)})")


def _params(text: str, spec: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not math.isfinite(number) or number < 0:
            raise TraceError(f"{spec}: {item!r} is not key=number (a finite number, not negative)")
        out[key.strip()] = number
    return out


def _load_file(path: Path, interval_s: float) -> Trace:
    if interval_s <= 0 or not math.isfinite(interval_s):
        raise TraceError(f"--interval-s must be a positive number of seconds, not {interval_s}")
    with path.open(encoding="utf-8", errors="replace") as f:
        first = f.readline(MAX_LINE)
    if "timestamp" in [c.strip() for c in first.split(",")]:
        return CsvTrace(path)
    rates = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                rate = float(text)
            except ValueError:
                rate = math.nan
            if not (0 <= rate <= MAX_RATE):
                raise TraceError(
                    f"{path}:{number}: {text[:40]!r} is not a rate in requests/s (0 to {MAX_RATE:g}); "
                    "a CSV trace needs a header row with a timestamp column"
                )
            rates.append(rate)
    if not rates:
        raise TraceError(f"{path}: no rates in the file (one requests/s figure per line)")
    return RateTrace(tuple(rates), interval_s)


def generate(name: str, p: dict[str, float], seed: int = 1) -> RateTrace:
    """A built-in trace, one rate per second; the same parameters always give the same trace."""
    seconds = int(p.get("seconds", 600))
    if not 1 <= seconds <= 10_000_000:
        raise TraceError(f"{name}: seconds must be between 1 and 10000000, not {seconds}")
    rng = random.Random(int(p.get("seed", seed)))
    if name in FAMILIES:
        return RateTrace(tuple(shaped(name, p, seconds, rng)))
    if name == "poisson":
        return RateTrace((p.get("rate", 20.0),) * seconds)
    if name == "mmpp":
        return RateTrace(tuple(_mmpp(p, seconds, rng)))
    return RateTrace(tuple(_diurnal(p, seconds)))


def _mmpp(p: dict[str, float], seconds: int, rng: random.Random) -> Iterator[float]:
    """Calm at ``base`` for ``off_s`` on average, bursts at ``burst`` for ``on_s`` on average."""
    base, burst = p.get("base", 20.0), p.get("burst", 60.0)
    on_s, off_s = max(p.get("on_s", 15.0), 1e-3), max(p.get("off_s", 60.0), 1e-3)
    bursting, left = False, rng.expovariate(1 / off_s)
    for _ in range(seconds):
        while left <= 0:
            bursting = not bursting
            left += rng.expovariate(1 / (on_s if bursting else off_s))
        left -= 1
        yield burst if bursting else base


def _diurnal(p: dict[str, float], seconds: int) -> Iterator[float]:
    """A sine around ``mean`` (``amplitude`` as a share of it) over ``period_s``, and a flash crowd
    of ``flash`` times the rate for ``flash_s`` from ``flash_at_s``."""
    mean, amplitude = p.get("mean", 20.0), min(p.get("amplitude", 0.5), 1.0)
    period = max(p.get("period_s", 600.0), 1.0)
    flash_at, flash_s, flash = p.get("flash_at_s", seconds / 2), p.get("flash_s", 30.0), p.get("flash", 3.0)
    for t in range(seconds):
        rate = mean * (1 - amplitude * math.cos(2 * math.pi * t / period))
        yield rate * flash if flash_at <= t < flash_at + flash_s else rate


def arrivals(trace: Trace, shaping: Shaping, rng: random.Random) -> Iterator[Arrival]:
    """Arrivals in time order, labelled and sized; the same ``rng`` state gives the same stream."""
    if isinstance(trace, CsvTrace):
        yield from _csv_arrivals(trace.path, shaping, rng)
        return
    end = shaping.duration_s if shaping.duration_s is not None else math.inf
    at = 0.0
    for index, rate in enumerate(trace.rates):
        start = index * trace.interval_s
        stop = min(start + trace.interval_s, end)
        scaled = rate * shaping.scale
        at = start
        while scaled > 0:
            at += rng.expovariate(scaled)
            if at >= stop:
                break
            yield _labelled(at, None, None, shaping, rng)
        if stop >= end:
            return


def _labelled(
    at: float, size: int | None, label: str | None, shaping: Shaping, rng: random.Random
) -> Arrival:
    draw = rng.random()
    if size is None:
        size = shaping.large_bytes if draw < shaping.large_share else shaping.request_bytes
    confidential = rng.random() < shaping.confidential_share if label is None else label != "public"
    # Drawn only when asked for, so that a trace without sheddable requests is the stream it was.
    sheddable = shaping.sheddable_share > 0 and rng.random() < shaping.sheddable_share
    return Arrival(at, size, confidential, sheddable=sheddable)


def _csv_arrivals(path: Path, shaping: Shaping, rng: random.Random) -> Iterator[Arrival]:
    end = shaping.duration_s if shaping.duration_s is not None else math.inf
    last, first = -math.inf, None
    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        for row_number, row in enumerate(csv.DictReader(f), 2):
            stamp = _number(row.get("timestamp"), path, row_number, "timestamp")
            first = stamp if first is None else first
            at = (stamp - first) / shaping.scale
            if at < last:
                raise TraceError(f"{path}:{row_number}: timestamps must not go back ({at} after {last})")
            if at >= end:
                return
            last = at
            raw_size = row.get("bytes")
            size = int(_number(raw_size, path, row_number, "bytes")) if raw_size else None
            label = (row.get("classification") or "").strip().lower() or None
            arrival = _labelled(at, size, label, shaping, rng)
            tenant = (row.get("tenant") or "").strip()[:MAX_TENANT]
            yield arrival._replace(tenant=tenant) if tenant else arrival


def _number(text: str | None, path: Path, row: int, column: str) -> float:
    try:
        value = float(text or "")
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise TraceError(f"{path}:{row}: {column} {str(text)[:40]!r} is not a number of seconds or bytes")
    return value
