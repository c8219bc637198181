"""An open-loop load generator: requests leave on a schedule, whatever the answers' latency.

A closed loop (send, wait, send) slows down with the system it measures and hides overload; a
demo of overflow needs arrivals that keep coming. Each request is recorded with when it left,
how long it took, its status, and where the gateway said it went.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

from functions.contract import HEADER_COLD, HEADER_DECISION, HEADER_INSTANCE
from functions.sidecar_client import UpstreamPool, UpstreamUnavailable

BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]},
        ]
    }
).encode()


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    rate_per_s: float


def phase_at(phases: list[Phase], elapsed_s: float) -> tuple[int, Phase]:
    """The phase the schedule is in ``elapsed_s`` after it started (the last one once it is over)."""
    end = 0.0
    for index, phase in enumerate(phases):
        end += phase.seconds
        if elapsed_s < end:
            return index, phase
    return len(phases) - 1, phases[-1]


def phase_bounds(phases: list[Phase]) -> list[tuple[str, float, float]]:
    """Each phase's name, start and end in seconds from the start of the schedule."""
    bounds, start = [], 0.0
    for phase in phases:
        bounds.append((phase.name, start, start + phase.seconds))
        start += phase.seconds
    return bounds


@dataclass
class Sample:
    sent_at: float
    phase: str
    sensitive: bool
    latency_s: float = 0.0
    upstream_ms: float | None = None
    status: int = 0
    target: str = ""
    reason: str = ""
    instance: str = ""
    cold: bool = False
    error: str = ""


@dataclass
class LoadRun:
    samples: list[Sample] = field(default_factory=list)
    sent: int = 0
    answered: int = 0


async def generate(
    host: str,
    port: int,
    phases: list[Phase],
    sensitive_share: float,
    run: LoadRun,
    model: str = "add_sub",
    seed: int = 7,
    timeout_s: float = 60.0,
) -> None:
    """Send requests at each phase's rate (Poisson arrivals); returns when every one is answered."""
    rng = random.Random(seed)
    pool = UpstreamPool(host, port, max_idle=256)
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    at = 0.0
    try:
        for phase in phases:
            end = at + phase.seconds
            while True:
                at += rng.expovariate(phase.rate_per_s)
                if at >= end:
                    at = end
                    break
                delay = start + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                sample = Sample(at, phase.name, rng.random() < sensitive_share)
                run.samples.append(sample)
                run.sent += 1
                task = asyncio.ensure_future(_one(pool, model, sample, run, timeout_s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))
    finally:
        pool.close()


async def _one(pool: UpstreamPool, model: str, sample: Sample, run: LoadRun, timeout_s: float) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"x-data-classification", b"confidential" if sample.sensitive else b"public"),
    ]
    started = time.perf_counter()
    try:
        answer = await pool.request("POST", f"/v2/models/{model}/infer", headers, BODY, timeout_s)
    except (UpstreamUnavailable, TimeoutError, OSError) as exc:
        sample.error = repr(exc)
    else:
        got = {k.decode(): v.decode("latin-1") for k, v in answer.headers}
        sample.status = answer.status
        sample.target, _, sample.reason = got.get(HEADER_DECISION, "unknown;").partition(";")
        sample.instance = got.get(HEADER_INSTANCE, "")
        sample.cold = got.get(HEADER_COLD) == "1"
        upstream = got.get("x-spillway-upstream-ms")
        sample.upstream_ms = float(upstream) if upstream else None
        if answer.status >= 400:
            sample.error = answer.body[:300].decode("utf-8", "replace")
    sample.latency_s = time.perf_counter() - started
    run.answered += 1
