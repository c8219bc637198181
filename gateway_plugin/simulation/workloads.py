"""Rate traces shaped like published serverless workloads, one rate (requests/s) per second.

Each family imitates a shape a published characterisation of production function invocations
reports; none reads or downloads data. The parameters are ``name:key=value,...`` on the command
line; ``mean`` sets the trace's mean rate exactly (the shape is made first, then scaled), so a
load of "2x the cluster's capacity" means the same thing on every family.

- ``heavy``: per-minute rates drawn from a heavy-tailed (lognormal) distribution with
  minute-to-minute correlation, Poisson within each minute. Shahrad et al., "Serverless in the
  Wild", USENIX ATC 2020 (Azure Functions, 2019): invocation counts are published per minute and
  their rates spread over orders of magnitude. ``sigma`` (1.0) is the spread of log rates,
  ``phi`` (0.6) their correlation from one minute to the next (``block_s``, 60: the minute).
- ``burst``: a steady background with bursts of ``low``-``high`` (10-50) times it, reached within
  ``rise_s`` (1 s), lasting ``burst_s`` (6 s) on average and decaying, every ``gap_s`` (90 s) on
  average. The per-second burstiness Joosen et al., "How Does It Function?", ACM SoCC 2023 report
  in Huawei Cloud's per-second function traces (bursts a per-minute count hides), and the sudden
  surges Wang et al., "FaaSNet", USENIX ATC 2021 report for Alibaba Cloud Function Compute.
- ``cron``: timer-triggered spikes of ``factor`` (20) times a background at every ``period_s``
  (60 s), lasting ``spike_s`` (3 s), every ``major``-th (5th) one ``major_factor`` (3) times larger
  (jobs on several schedules firing together). Timer triggers are 16 % of Azure's functions
  (Shahrad et al.); Huawei's traces show strong periodicity (Joosen et al.).
- ``daily``: a daily cycle compressed into ``period_s`` (1200 s), peak ``peak`` (8) times the
  trough, with lognormal per-minute noise of ``sigma`` (0.3): the diurnal pattern both Azure's and
  Huawei's aggregate invocations follow.
- ``sporadic``: idle gaps of ``idle_s`` (400 s, past a function's usual idle TTL, so instances are
  reaped between episodes) on average, then episodes of ``active_s`` (30 s) whose intensities are
  lognormal (``sigma`` 1.0): most functions are invoked rarely, with long idle times between
  invocations (Shahrad et al.).
- ``rare_bursts``: a two-state Markov-modulated Poisson process, calm at a base rate and bursting
  at ``factor`` (10) times it, each state held an exponential time of mean ``off_s`` (600 s) calm
  and ``on_s`` (120 s) bursting: rare, long bursts, the first state drawn from the stationary
  share. The base rate is whatever gives the trace its ``mean``. The MMPP of Fischer and
  Meier-Hellstern, "The Markov-modulated Poisson process (MMPP) cookbook", Performance
  Evaluation 18(2), 1993, the usual model of bursty arrivals; the bursts lasting minutes the
  Azure and Huawei traces show on top of their cycles (Shahrad et al.; Joosen et al.).
- ``flash``: the ``daily`` cycle with a flash crowd: ``flash_factor`` (10) times the rate for
  ``flash_s`` (60 s) from a start drawn uniformly over the trace (``flash_at_s`` fixes it). Jung,
  Krishnamurthy and Rabinovich, "Flash Crowds and Denial of Service Attacks", WWW 2002: a sudden
  surge of many times the usual rate, over in minutes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

FAMILIES = ("heavy", "burst", "cron", "daily", "sporadic", "rare_bursts", "flash")
Params = dict[str, float]


def _heavy(p: Params, seconds: int, rng: random.Random) -> list[float]:
    sigma, phi, block = p.get("sigma", 1.0), min(p.get("phi", 0.6), 0.99), max(int(p.get("block_s", 60)), 1)
    level, out = 0.0, []
    for minute in range(math.ceil(seconds / block)):
        shock = rng.gauss(0.0, sigma * math.sqrt(1 - phi * phi))
        level = phi * level + shock if minute else rng.gauss(0.0, sigma)
        out.extend([math.exp(level)] * block)
    return out[:seconds]


def _burst(p: Params, seconds: int, rng: random.Random) -> list[float]:
    low, high = p.get("low", 10.0), p.get("high", 50.0)
    rise, length, gap = max(p.get("rise_s", 1.0), 1.0), p.get("burst_s", 6.0), p.get("gap_s", 90.0)
    out = [1.0] * seconds
    at = rng.expovariate(1 / max(gap, 1.0))
    while at < seconds:
        factor, lasts = rng.uniform(low, high), rng.expovariate(1 / max(length, 1.0)) + rise
        for t in range(int(at), min(seconds, int(at + lasts + length) + 1)):
            since = t - at
            shape = (
                since / rise if since < rise else math.exp(-max(0.0, since - lasts) / max(length / 3, 0.5))
            )
            out[t] = max(out[t], 1.0 + (factor - 1.0) * min(1.0, max(0.0, shape)))
        at += lasts + rng.expovariate(1 / max(gap, 1.0))
    return out


def _cron(p: Params, seconds: int, rng: random.Random) -> list[float]:
    period, spike = max(int(p.get("period_s", 60.0)), 1), max(int(p.get("spike_s", 3.0)), 1)
    factor, major, major_factor = p.get("factor", 20.0), int(p.get("major", 5.0)), p.get("major_factor", 3.0)
    out = [1.0] * seconds
    for index, start in enumerate(range(0, seconds, period)):
        height = factor * (major_factor if major and index % major == 0 else 1.0)
        fired = start + rng.randint(0, 1)  # timers fire within a second of their schedule
        for t in range(fired, min(seconds, fired + spike)):
            out[t] = height * (1.0 - 0.5 * (t - fired) / spike)
    return out


def _daily(p: Params, seconds: int, rng: random.Random) -> list[float]:
    period, peak, sigma = (
        max(p.get("period_s", 1200.0), 60.0),
        max(p.get("peak", 8.0), 1.0),
        p.get("sigma", 0.3),
    )
    out, noise = [], 1.0
    for t in range(seconds):
        if t % 60 == 0:
            noise = math.exp(rng.gauss(0.0, sigma))
        phase = (1 - math.cos(2 * math.pi * t / period)) / 2
        out.append((1 + (peak - 1) * phase) * noise)
    return out


def _sporadic(p: Params, seconds: int, rng: random.Random) -> list[float]:
    idle, active, sigma = (
        max(p.get("idle_s", 400.0), 1.0),
        max(p.get("active_s", 30.0), 1.0),
        p.get("sigma", 1.0),
    )
    out = [0.0] * seconds
    at = rng.expovariate(1 / idle) / 4  # the first episode comes early, so a short trace has one
    while at < seconds:
        lasts, level = rng.expovariate(1 / active) + 1.0, math.exp(rng.gauss(0.0, sigma))
        for t in range(int(at), min(seconds, int(at + lasts) + 1)):
            out[t] = level
        at += lasts + rng.expovariate(1 / idle)
    return out


def _rare_bursts(p: Params, seconds: int, rng: random.Random) -> list[float]:
    factor = max(p.get("factor", 10.0), 1.0)
    on_s, off_s = max(p.get("on_s", 120.0), 1e-3), max(p.get("off_s", 600.0), 1e-3)
    bursting = rng.random() < on_s / (on_s + off_s)
    left = rng.expovariate(1 / (on_s if bursting else off_s))
    out = []
    for _ in range(seconds):
        # each second's rate is its states' rates weighted by the time spent in each
        rate, used = 0.0, 0.0
        while left < 1.0 - used:
            rate += left * (factor if bursting else 1.0)
            used += left
            bursting = not bursting
            left = rng.expovariate(1 / (on_s if bursting else off_s))
        rate += (1.0 - used) * (factor if bursting else 1.0)
        left -= 1.0 - used
        out.append(rate)
    return out


def _flash(p: Params, seconds: int, rng: random.Random) -> list[float]:
    out = _daily(p, seconds, rng)
    factor, lasts = max(p.get("flash_factor", 10.0), 1.0), max(int(p.get("flash_s", 60.0)), 1)
    start = int(p.get("flash_at_s", rng.randint(0, max(0, seconds - lasts))))
    for t in range(start, min(seconds, start + lasts)):
        out[t] *= factor
    return out


SHAPES: dict[str, Callable[[Params, int, random.Random], list[float]]] = {
    "heavy": _heavy,
    "burst": _burst,
    "cron": _cron,
    "daily": _daily,
    "sporadic": _sporadic,
    "rare_bursts": _rare_bursts,
    "flash": _flash,
}


def shaped(name: str, p: Params, seconds: int, rng: random.Random) -> list[float]:
    """The family's rates for ``seconds`` seconds, scaled so that their mean is ``mean`` (20)."""
    rates = SHAPES[name](p, seconds, rng)
    total = sum(rates)
    if total <= 0:
        rates, total = [1.0] * seconds, float(seconds)
    factor = p.get("mean", 20.0) * seconds / total
    return [r * factor for r in rates]
