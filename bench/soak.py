"""A soak: sustained load through the development gateway to real functions, with memory watched.

What it starts, all on loopback: a signed function (``python -m functions serve --platform local``
with its Triton sidecar, the example ``add_sub`` model, ``SPILLWAY_SIGNING_KEY`` set, access log
on); an unsigned function standing for the on-prem cluster; and the development gateway
(``python -m devtools devgateway``, which starts the runner as its child) with a rule that
sends every request that may leave to the target ``aws`` (the signed function, ``sign_body``), and
the upstreams ``local`` (the on-prem function) and ``aws`` (the signed function).

What it sends, for ``--duration-s``: a closed loop of ``--clients`` keep-alive connections to the
gateway, each sending its next request when the last was answered. Most are ``add_sub``
inferences (the JSON body of ``testing/function.py``'s ``ADD_SUB_BODY``) labelled ``public``,
``confidential`` or not at all, some for a fixed or a never-seen tenant; the rest is hostile
variety: path variants that normalise to the inference route, never-seen model names (404 from
Triton), administration paths (403 from the function), metadata and health reads, stray paths.
Beside it a trickle of misbehaving connections, to the gateway and straight to the function:
request heads left unfinished (abandoned, or held until the server's header timeout), a body
that stops (body timeout), and keep-alive connections left idle (idle timeout).

What it watches, every ``--sample-s``: VmRSS (and RssAnon, open descriptors, CPU) of the function,
its tritonserver and Python backend stub, the on-prem function and its Triton and stub, the
gateway and its runner; requests/s, answers by status, p50/p99 latency, and the number of series
the runner and the functions expose on their metrics endpoints.

Verdict: for each process, RSS from the end of the warm-up (``--warmup-s``, default 60 s) on
stays within ``--rss-tolerance`` (default 10 %) of its value at that mark (max, min, end and the
least-squares slope in MiB/min are reported); every request sent got an answer; no 5xx but 503;
every answer has the status its kind expects; no confidential or unlabelled request was decided
``aws`` (``X-Spillway-Decision``) or seen by the signed function (its access log); every
misbehaving connection was closed by the server within its timeout (plus a small slack).
Progress goes to stderr; the result (time series included) to ``--out`` as JSON; the processes'
logs to the folder next to it. Exit status 0 when everything held, 1 otherwise.

The signed function keeps every nonce it accepted until the signature can no longer be fresh
(``functions.signature.MAX_SKEW_S``, 300 s), so its RSS rises with the signed request rate for
the first five minutes of load and is flat from then on; ``--warmup-s 310`` judges after that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from harness import (
    EXAMPLE_REPOSITORY,
    LOOPBACK,
    ROOT,
    Launched,
    cpu_seconds,
    free_port,
    http_call,
    launch,
    machine_note,
    poll,
    render_table,
    running,
    say,
    shm_regions,
    warn_leaked,
)

from functions.cli import serve_command
from functions.settings import HttpLimits
from functions.signature import sign

# The same bytes as ``testing/function.py``'s ``ADD_SUB_BODY``.
ADD_SUB_BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]},
        ]
    }
).encode()
CLASSIFICATION = "x-data-classification"
DECISION = "x-spillway-decision"
TENANT = "x-tenant"
# Misbehaving connections count as closed in time up to this long past the server's timeout.
TIMEOUT_SLACK_S = 5.0

INFER = "/v2/models/add_sub/infer"
PATH_VARIANTS = (
    "/v2/./models/add_sub/infer",
    "//v2/models/add_sub/infer",
    "/v2/models/add_sub/versions/1/infer",
    "/v2/models/elsewhere/../add_sub/infer",
    "/v2/models/%61dd_sub/infer",
    "/v2/models/add_sub/infer/",
)
ADMIN = (
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/add_sub/unload"),
    ("POST", "/v2/repository/models/add_sub/load"),
    ("GET", "/v2/logging"),
    ("POST", "/v2/trace/setting"),
    ("GET", "/v2/systemsharedmemory/status"),
    ("GET", "/v2/cudasharedmemory/status"),
    ("GET", "/v2/models/add_sub/config"),
    ("GET", "/v2/models/add_sub/stats"),
    ("POST", "/v2/./repository/index"),
    ("POST", "/v2/models/add_sub/../../repository/index"),
    ("POST", "/v2/%72epository/index"),
    ("POST", "//v2//repository/models/add_sub/unload"),
)
STRAY = ("/", "/favicon.ico", "/v3/models/add_sub/infer", "/admin", "/spillway/nothing")
FIXED_TENANTS = ("team-a", "team-b", "team-c")


# --- the requests ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Planned:
    """One request of the mix and the statuses its kind may get (503 is always allowed, and counted)."""

    kind: str
    label: str | None
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    expect: frozenset[int]

    def encode(self, host: str) -> bytes:
        lines = [f"{self.method} {self.path} HTTP/1.1", f"host: {host}"]
        lines.extend(f"{k}: {v}" for k, v in self.headers)
        lines.append(f"content-length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


class Mix:
    """Draws the next request: mostly inferences, with a share of hostile variety."""

    KINDS = (
        ("infer", 0.70),
        ("variant", 0.08),
        ("unknown_model", 0.07),
        ("admin", 0.05),
        ("metadata", 0.05),
        ("health", 0.03),
        ("stray", 0.02),
    )

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.serial = 0
        self._kinds = [k for k, _ in self.KINDS]
        self._weights = [w for _, w in self.KINDS]

    def label(self) -> str | None:
        roll = self.rng.random()
        return "public" if roll < 0.45 else "confidential" if roll < 0.75 else None

    def headers(self, label: str | None, body: bool) -> tuple[tuple[str, str], ...]:
        out: list[tuple[str, str]] = []
        if body:
            out.append(("content-type", "application/json"))
        if label is not None:
            out.append((CLASSIFICATION, label))
        roll = self.rng.random()
        if roll < 0.25:
            out.append((TENANT, self.rng.choice(FIXED_TENANTS)))
        elif roll < 0.40:
            out.append((TENANT, f"t-{self.serial}-{secrets.token_hex(3)}"))
        return tuple(out)

    def next(self) -> Planned:
        self.serial += 1
        kind = self.rng.choices(self._kinds, self._weights)[0]
        label = self.label()
        if kind == "infer":
            path = INFER if self.rng.random() < 0.9 else f"{INFER}?soak={self.serial}"
            return Planned(
                kind, label, "POST", path, self.headers(label, True), ADD_SUB_BODY, frozenset({200})
            )
        if kind == "variant":
            path = self.rng.choice(PATH_VARIANTS)
            return Planned(
                kind, label, "POST", path, self.headers(label, True), ADD_SUB_BODY, frozenset({200})
            )
        if kind == "unknown_model":
            name = f"m-{self.serial}-{secrets.token_hex(4)}"
            if self.rng.random() < 0.5:
                path = f"/v2/models/{name}/infer"
                return Planned(
                    kind, label, "POST", path, self.headers(label, True), ADD_SUB_BODY, frozenset({404})
                )
            return Planned(
                kind,
                label,
                "GET",
                f"/v2/models/{name}",
                self.headers(label, False),
                b"",
                frozenset({404}),
            )
        if kind == "admin":
            method, path = self.rng.choice(ADMIN)
            body = b"{}" if method == "POST" else b""
            return Planned(kind, label, method, path, self.headers(label, bool(body)), body, frozenset({403}))
        if kind == "metadata":
            path = self.rng.choice(("/v2/models/add_sub", "/v2/models/add_sub/ready", "/v2"))
            return Planned(kind, label, "GET", path, self.headers(label, False), b"", frozenset({200}))
        if kind == "health":
            path = self.rng.choice(("/v2/health/ready", "/v2/health/live"))
            return Planned(kind, label, "GET", path, self.headers(label, False), b"", frozenset({200}))
        path = self.rng.choice(STRAY)
        return Planned(kind, label, "GET", path, self.headers(label, False), b"", frozenset({404}))


# --- a small keep-alive client --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    line = await reader.readline()
    if not line:
        raise ConnectionError("closed before an answer")
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ConnectionError(f"not an HTTP status line: {line[:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    keep_alive = headers.get("connection", "").lower() != "close" and parts[0] == b"HTTP/1.1"
    return Reply(status, headers, body, keep_alive)


class KeepAlive:
    """One connection, reopened when the server closes it."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self.host = f"{LOOPBACK}:{port}"
        self.opened = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def call(self, request: bytes) -> Reply:
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(LOOPBACK, self.port)
            self.opened += 1
        assert self._reader is not None
        self._writer.write(request)
        try:
            reply = await asyncio.wait_for(read_reply(self._reader), self.timeout_s)
        except BaseException:
            self.close()
            raise
        if not reply.keep_alive:
            self.close()
        return reply

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


# --- what was seen ---------------------------------------------------------------------------


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)
    transport: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    residency_violations: int = 0
    missing_decision: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)

    def record(self, planned: Planned, reply: Reply | None, error: str | None, ms: float) -> None:
        if reply is None:
            self.transport[error or "error"] += 1
            self.examples.setdefault(f"transport {error}", f"{planned.method} {planned.path}")
            return
        self.answered += 1
        self.latencies_ms.append(ms)
        self.statuses[reply.status] += 1
        self.by_kind[f"{planned.kind} {reply.status}"] += 1
        if reply.status not in planned.expect and reply.status != 503:
            key = f"{planned.kind} {planned.label or 'unlabelled'} {reply.status}"
            self.unexpected[key] += 1
            self.examples.setdefault(key, f"{planned.method} {planned.path}: {reply.body[:300]!r}")
        decision = reply.headers.get(DECISION)
        if decision is None:
            self.missing_decision += 1
            return
        target = decision.split(";", 1)[0]
        self.decisions[f"{planned.label or 'unlabelled'} -> {decision}"] += 1
        if planned.label != "public" and target != "local" and target != "shed":
            self.residency_violations += 1
            key = f"residency {planned.label or 'unlabelled'} {decision}"
            self.examples.setdefault(key, f"{planned.method} {planned.path}")

    def summary(self, seconds: float) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        return {
            "sent": self.sent,
            "answered": self.answered,
            "requests_per_s": self.answered / seconds if seconds > 0 else 0.0,
            "p50_ms": percentile(lat, 0.50),
            "p99_ms": percentile(lat, 0.99),
            "max_ms": lat[-1] if lat else math.nan,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "unexpected": dict(self.unexpected),
            "transport_errors": dict(self.transport),
            "residency_violations": self.residency_violations,
            "missing_decision": self.missing_decision,
        }


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest rank on sorted values."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Stats:
    def __init__(self) -> None:
        self.total = Tally()
        self.window = Tally()

    def sent(self) -> None:
        self.total.sent += 1
        self.window.sent += 1

    def record(self, planned: Planned, reply: Reply | None, error: str | None, ms: float) -> None:
        self.total.record(planned, reply, error, ms)
        self.window.record(planned, reply, error, ms)

    def roll(self) -> Tally:
        window, self.window = self.window, Tally()
        return window


async def client(port: int, mix: Mix, stats: Stats, stop: asyncio.Event, timeout_s: float) -> int:
    """One closed-loop client; returns the connections it opened."""
    conn = KeepAlive(port, timeout_s)
    try:
        while not stop.is_set():
            planned = mix.next()
            stats.sent()
            started = time.perf_counter()
            try:
                reply = await conn.call(planned.encode(conn.host))
            except TimeoutError:
                stats.record(planned, None, "timeout", 0.0)
                continue
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                stats.record(planned, None, type(exc).__name__, 0.0)
                await asyncio.sleep(0.05)
                continue
            stats.record(planned, reply, None, (time.perf_counter() - started) * 1000)
    finally:
        conn.close()
    return conn.opened


# --- misbehaving connections -----------------------------------------------------------------


@dataclass(frozen=True)
class Misbehaviour:
    name: str
    door: str  # "gateway" or "function"
    timeout_s: float | None  # the server's timeout it waits out; None when the client leaves first


@dataclass
class TrickleLog:
    outcomes: Counter[str] = field(default_factory=Counter)
    closed_after_s: dict[str, list[float]] = field(default_factory=dict)
    overdue: list[str] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0

    def done(self, what: Misbehaviour, outcome: str, after_s: float | None = None) -> None:
        self.outcomes[f"{what.door} {what.name} {outcome}"] += 1
        if after_s is not None:
            self.closed_after_s.setdefault(f"{what.door} {what.name}", []).append(round(after_s, 2))

    def summary(self) -> dict[str, Any]:
        return {
            "outcomes": dict(sorted(self.outcomes.items())),
            "closed_after_s": {
                k: {"n": len(v), "min": min(v), "median": statistics.median(v), "max": max(v)}
                for k, v in sorted(self.closed_after_s.items())
            },
            "overdue": self.overdue[:20],
            "most_open_at_once": self.most_open,
        }


async def _wait_closed(reader: asyncio.StreamReader, limit_s: float) -> tuple[str, float]:
    """Wait for the server's answer or close; the first status (or 'closed') and when it came."""
    started = time.perf_counter()
    first = await asyncio.wait_for(reader.read(65536), limit_s)
    after = time.perf_counter() - started
    if not first:
        return "closed", after
    status = first.split(b" ", 2)[1].decode("ascii", "replace") if first.startswith(b"HTTP/") else "data"
    with contextlib.suppress(TimeoutError, OSError):
        while await asyncio.wait_for(reader.read(65536), 10.0):
            pass
    return status, after


async def misbehave(
    what: Misbehaviour, port: int, rng: random.Random, log: TrickleLog, first_request: bytes
) -> None:
    log.open_now += 1
    log.most_open = max(log.most_open, log.open_now)
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        if what.name == "partial_head_abandoned":
            writer.write(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nhost: soak\r\ncontent-ty")
            await asyncio.sleep(rng.uniform(0.5, 5.0))
            log.done(what, "abandoned")
            return
        if what.name == "partial_head_held":
            writer.write(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nhost: soak\r\nx-data-classif")
        elif what.name == "slow_body":
            writer.write(
                b"POST /v2/models/add_sub/infer HTTP/1.1\r\nhost: soak\r\n"
                b"x-data-classification: confidential\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(ADD_SUB_BODY), ADD_SUB_BODY[:20])
            )
        elif what.name == "idle_keepalive":
            writer.write(first_request)
            reply = await asyncio.wait_for(read_reply(reader), 30.0)
            log.done(what, f"first answer {reply.status}")
        assert what.timeout_s is not None
        limit = what.timeout_s + TIMEOUT_SLACK_S
        try:
            outcome, after = await _wait_closed(reader, limit)
        except TimeoutError:
            log.done(what, "still open past the timeout")
            log.overdue.append(f"{what.door} {what.name}: open {limit:.0f} s")
            return
        log.done(what, outcome, after)
    except asyncio.CancelledError:
        log.done(what, "open at the end")
        raise
    except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
        log.done(what, f"error {type(exc).__name__}")
    finally:
        log.open_now -= 1
        if writer is not None:
            writer.close()


async def trickle(
    every_s: float,
    doors: dict[str, int],
    limits: HttpLimits,
    rng: random.Random,
    log: TrickleLog,
    stop: asyncio.Event,
    first_requests: dict[str, bytes],
    max_open: int = 64,
) -> None:
    """One misbehaving connection every ``every_s``, the kinds in turn; ``first_requests`` holds,
    per door, the request an idle keep-alive connection sends before it idles."""
    kinds = [
        Misbehaviour("partial_head_abandoned", "gateway", None),
        Misbehaviour("partial_head_held", "gateway", limits.header_timeout_s),
        Misbehaviour("idle_keepalive", "gateway", limits.idle_timeout_s),
        Misbehaviour("partial_head_abandoned", "function", None),
        Misbehaviour("slow_body", "gateway", limits.body_timeout_s),
        Misbehaviour("partial_head_held", "function", limits.header_timeout_s),
        Misbehaviour("idle_keepalive", "function", limits.idle_timeout_s),
    ]
    tasks: set[asyncio.Task[None]] = set()
    turn = 0
    try:
        while not stop.is_set():
            if log.open_now < max_open:
                what = kinds[turn % len(kinds)]
                turn += 1
                task = asyncio.create_task(
                    misbehave(what, doors[what.door], rng, log, first_requests[what.door])
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --- processes and their memory ------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def child_matching(parent: int | None, needle: str) -> int | None:
    """The first live child of ``parent`` whose command line holds ``needle``."""
    if parent is None:
        return None
    try:
        with open(f"/proc/{parent}/task/{parent}/children") as f:
            children = [int(p) for p in f.read().split()]
    except OSError:
        return None
    for pid in sorted(children):
        if needle in _cmdline(pid):
            return pid
    return None


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and RssAnon (KiB), threads and open descriptors of one process; empty when it is gone."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon"):
                out[name] = int(value.split()[0])
            elif name == "Threads":
                out[name] = int(value)
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return {}
    return out


@dataclass
class Watched:
    """A process found anew at each sample (a restarted Triton gets a new pid, which is noted)."""

    name: str
    find: Callable[[], int | None]
    pids: list[int] = field(default_factory=list)
    last_cpu: float | None = None
    last_t: float | None = None

    def sample(self, now: float) -> dict[str, Any]:
        pid = self.find()
        if pid is None:
            return {"pid": None}
        if not self.pids or self.pids[-1] != pid:
            self.pids.append(pid)
            self.last_cpu = self.last_t = None
        status = proc_status(pid)
        cpu = cpu_seconds(pid)
        cpu_pct = None
        if self.last_cpu is not None and self.last_t is not None and now > self.last_t:
            cpu_pct = round((cpu - self.last_cpu) / (now - self.last_t) * 100, 1)
        self.last_cpu, self.last_t = cpu, now
        return {
            "pid": pid,
            "rss_mib": round(status["VmRSS"] / 1024, 2) if "VmRSS" in status else None,
            "anon_mib": round(status["RssAnon"] / 1024, 2) if "RssAnon" in status else None,
            "threads": status.get("Threads"),
            "fds": status.get("fds"),
            "cpu_pct": cpu_pct,
        }


def slope_per_min(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, MiB)`` points, in MiB per minute."""
    if len(points) < 2:
        return math.nan
    ts = [t / 60 for t, _ in points]
    rs = [r for _, r in points]
    mt, mr = statistics.fmean(ts), statistics.fmean(rs)
    den = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (r - mr) for t, r in zip(ts, rs, strict=True)) / den if den else math.nan


def rss_verdict(
    series: list[tuple[float, float | None]], warmup_s: float, tolerance: float, pids: list[int]
) -> dict[str, Any]:
    """RSS from the warm-up mark on against its value at the mark; slope by least squares.

    The slope over the second half of that span is reported too (not judged): a bounded structure
    that fills after the mark levels off there, a leak does not.
    """
    after = [(t, r) for t, r in series if t >= warmup_s - 1e-6]
    values = [(t, r) for t, r in after if r is not None]
    if not values:
        return {"ok": False, "why": "no samples after the warm-up"}
    t0, base = values[0]
    rss = [r for _, r in values]
    points = [(t, r) for t, r in values if r is not None]
    half = t0 + (points[-1][0] - t0) / 2
    late = [(t, r) for t, r in points if t >= half]
    worst = max(abs(r / base - 1) for r in rss) if base else math.inf
    why = []
    if worst > tolerance:
        why.append(f"moved {worst * 100:.1f} % from its value at {t0:.0f} s")
    if len(values) != len(after):
        why.append("gone at some samples")
    if len(pids) > 1:
        why.append(f"restarted (pids {pids})")
    return {
        "ok": not why,
        "why": "; ".join(why) or None,
        "at_mark_s": t0,
        "at_mark_mib": base,
        "end_mib": rss[-1],
        "min_mib": min(rss),
        "max_mib": max(rss),
        "max_deviation_pct": round(worst * 100, 2),
        "slope_mib_per_min": round(slope_per_min(points), 4),
        "late_slope_mib_per_min": round(slope_per_min(late), 4),
        "late_from_s": round(half, 1),
        "pids": pids,
    }


# --- the run ---------------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.key = secrets.token_hex(32)
        self.route_token = secrets.token_urlsafe(24)
        self.function_port = free_port()
        self.onprem_port = free_port()
        self.gateway_port = free_port()
        self.metrics_port = free_port()
        self.function: Launched | None = None
        self.onprem: Launched | None = None
        self.gateway: Launched | None = None
        # Where the function's log stood when the load began: its access log is checked from there.
        self.function_log_offset = 0

    def function_url(self) -> str:
        return f"http://{LOOPBACK}:{self.function_port}"

    def start(self, launched: list[Launched]) -> None:
        repo = self.work / "models"
        repo.mkdir()
        shutil.copytree(
            EXAMPLE_REPOSITORY / "add_sub", repo / "add_sub", ignore=shutil.ignore_patterns("__pycache__")
        )
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SPILLWAY_SIGNING_KEY", "SPILLWAY_ROUTE_TOKEN"))
        }
        base.update(PYTHONUNBUFFERED="1", SPILLWAY_MODELS="add_sub")
        say(f"starting the function on {self.function_port} (signed), the on-prem one on {self.onprem_port}")
        self.function = launch(
            serve_command(self.function_port, repo, host=LOOPBACK),
            {
                **base,
                "SPILLWAY_SIGNING_KEY": self.key,
                "SPILLWAY_ACCESS_LOG_HEADERS": f"{CLASSIFICATION},{TENANT}",
            },
            self.work / "function.log",
        )
        launched.append(self.function)
        self.onprem = launch(
            serve_command(self.onprem_port, repo, host=LOOPBACK),
            base,
            self.work / "onprem.log",
        )
        launched.append(self.onprem)
        function, onprem = self.function, self.onprem

        def signed_ready() -> bool:
            headers = {"x-spillway-signature": sign(self.key.encode(), "GET", "/v2/health/ready", b"")}
            return http_call(self.function_port, "GET", "/v2/health/ready", headers=headers)[0] == 200

        poll(signed_ready, 90, 0.1, lambda: not function.exited())
        poll(
            lambda: http_call(self.onprem_port, "GET", "/v2/health/ready")[0] == 200,
            90,
            0.1,
            lambda: not onprem.exited(),
        )
        config = {
            "targets": [
                {
                    "name": "aws",
                    "kind": "http",
                    "url": self.function_url(),
                    "cold_start_ms": 0,
                    "sign_body": True,
                }
            ],
            "rules": [{"name": "all-out", "action": "target", "targets": ["aws"]}],
            "tenants": {
                "default": {"requests_per_minute": 1_000_000},
                "max_tracked": self.args.max_tenants,
            },
            "metrics": {"listen": f"{LOOPBACK}:{self.metrics_port}"},
            "devgateway": {
                "listen": f"{LOOPBACK}:{self.gateway_port}",
                "upstreams": {"local": f"http://{LOOPBACK}:{self.onprem_port}", "aws": self.function_url()},
            },
        }
        config_path = self.work / "spillway.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        say(
            f"starting the development gateway on {self.gateway_port} (runner metrics on {self.metrics_port})"
        )
        self.gateway = launch(
            [sys.executable, "-m", "devtools", "devgateway", "--config", str(config_path)],
            {**base, "SPILLWAY_SIGNING_KEY": self.key, "SPILLWAY_ROUTE_TOKEN": self.route_token},
            self.work / "devgateway.log",
        )
        launched.append(self.gateway)
        gateway = self.gateway
        poll(lambda: http_call(self.gateway_port, "GET", "/")[0] > 0, 60, 0.1, lambda: not gateway.exited())
        headers = {"content-type": "application/json", CLASSIFICATION: "public"}
        status, _ = http_call(self.gateway_port, "POST", INFER, ADD_SUB_BODY, headers)
        if status != 200:
            raise RuntimeError(f"a public inference through the gateway got {status}")

    def watched(self) -> list[Watched]:
        assert self.function is not None and self.onprem is not None and self.gateway is not None
        fn, op, gw = self.function.proc.pid, self.onprem.proc.pid, self.gateway.proc.pid

        def triton(parent: int) -> Callable[[], int | None]:
            return lambda: child_matching(parent, "tritonserver")

        def stub(parent: int) -> Callable[[], int | None]:
            return lambda: child_matching(
                child_matching(parent, "tritonserver"), "triton_python_backend_stub"
            )

        return [
            Watched("function", lambda: fn),
            Watched("function_triton", triton(fn)),
            Watched("function_stub", stub(fn)),
            Watched("devgateway", lambda: gw),
            Watched("runner", lambda: child_matching(gw, "gateway_plugin run")),
            Watched("onprem", lambda: op),
            Watched("onprem_triton", triton(op)),
            Watched("onprem_stub", stub(op)),
        ]

    async def series_counts(self) -> dict[str, int | None]:
        """How many series each metrics endpoint exposes: growth would mean client-chosen labels."""
        signed = {"x-spillway-signature": sign(self.key.encode(), "GET", "/spillway/metrics", b"")}
        doors: tuple[tuple[str, int, str, dict[str, str]], ...] = (
            ("runner", self.metrics_port, "/metrics", {}),
            ("function", self.function_port, "/spillway/metrics", signed),
            ("onprem", self.onprem_port, "/spillway/metrics", {}),
        )
        out: dict[str, int | None] = {}
        for name, port, path, headers in doors:
            try:
                status, body = await asyncio.to_thread(http_call, port, "GET", path, b"", headers, 5.0)
            except OSError:
                out[name] = None
                continue
            lines = body.decode(errors="replace").splitlines()
            out[name] = (
                sum(1 for line in lines if line and not line.startswith("#")) if status == 200 else None
            )
        return out

    async def scrape_decisions(self) -> dict[str, float]:
        try:
            _, body = await asyncio.to_thread(http_call, self.metrics_port, "GET", "/metrics", b"", {}, 5.0)
        except OSError:
            return {}
        out: dict[str, float] = {}
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("spillway_decisions_total{"):
                name, _, value = line.rpartition(" ")
                out[name.removeprefix("spillway_decisions_total")] = float(value)
        return out

    async def load(self, watched: list[Watched]) -> dict[str, Any]:
        args = self.args
        rng = random.Random(args.seed)
        mix = Mix(rng)
        stats = Stats()
        stop = asyncio.Event()
        trickle_log = TrickleLog()
        first_requests = {
            # through the gateway: a confidential inference (it stays on premises);
            "gateway": Planned(
                "idle",
                "confidential",
                "POST",
                INFER,
                (("content-type", "application/json"), (CLASSIFICATION, "confidential")),
                ADD_SUB_BODY,
                frozenset({200}),
            ).encode(f"{LOOPBACK}:{self.gateway_port}"),
            # straight to the function: an unsigned health check (401, before anything is served).
            "function": Planned("idle", None, "GET", "/v2/health/live", (), b"", frozenset({401})).encode(
                f"{LOOPBACK}:{self.function_port}"
            ),
        }
        samples: list[dict[str, Any]] = []
        assert self.function is not None
        self.function_log_offset = self.function.log_path.stat().st_size
        started = time.perf_counter()
        samples.append(await self.sample(watched, 0.0, Tally(), 0.0))
        self.print_sample(samples[-1])
        clients = [
            asyncio.create_task(client(self.gateway_port, mix, stats, stop, args.request_timeout_s))
            for _ in range(args.clients)
        ]
        doors = {"gateway": self.gateway_port, "function": self.function_port}
        trickler = (
            asyncio.create_task(
                trickle(args.trickle_every_s, doors, HttpLimits(), rng, trickle_log, stop, first_requests)
            )
            if args.trickle_every_s > 0
            else None
        )
        last = 0.0
        count = math.ceil(args.duration_s / args.sample_s - 1e-9)
        dues = [min(k * args.sample_s, args.duration_s) for k in range(1, count + 1)]
        try:
            for due in dues:
                await asyncio.sleep(max(0.0, started + due - time.perf_counter()))
                now = time.perf_counter() - started
                window = stats.roll()
                samples.append(await self.sample(watched, now, window, now - last))
                self.print_sample(samples[-1])
                last = now
                for name, w in zip(
                    ("function", "onprem", "devgateway"),
                    (self.function, self.onprem, self.gateway),
                    strict=True,
                ):
                    if w is not None and w.exited():
                        raise RuntimeError(f"the {name} exited during the soak (code {w.proc.returncode})")
        finally:
            stop.set()
            opened = sum(await asyncio.gather(*clients, return_exceptions=False))
            if trickler is not None:
                await trickler
        elapsed = time.perf_counter() - started
        return {
            "samples": samples,
            "totals": stats.total,
            "elapsed_s": elapsed,
            "client_connections": opened,
            "trickle": trickle_log,
            "decisions_scraped": await self.scrape_decisions(),
        }

    async def sample(self, watched: list[Watched], t: float, window: Tally, seconds: float) -> dict[str, Any]:
        now = time.perf_counter()
        procs = {w.name: w.sample(now) for w in watched}
        summary = window.summary(seconds)
        summary.pop("unexpected")
        return {
            "t_s": round(t, 1),
            **summary,
            "unexpected": sum(window.unexpected.values()),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "series": await self.series_counts(),
            "processes": procs,
        }

    @staticmethod
    def print_sample(s: dict[str, Any]) -> None:
        short = {
            "function": "fn",
            "function_triton": "tri",
            "function_stub": "stub",
            "devgateway": "gw",
            "runner": "run",
            "onprem": "op",
            "onprem_triton": "optri",
            "onprem_stub": "opstub",
        }
        rss = " ".join(f"{short[n]} {p.get('rss_mib') or 0:.1f}" for n, p in s["processes"].items())
        codes = ",".join(f"{k}:{v}" for k, v in s["statuses"].items())
        bad = sum(s["transport_errors"].values()) + s["unexpected"] + s["residency_violations"]
        say(
            f"t={s['t_s']:5.0f}s {s['requests_per_s']:6.1f} req/s p50 {s['p50_ms']:6.1f} ms "
            f"p99 {s['p99_ms']:6.1f} ms bad {bad} [{codes}] load {s['loadavg_1m']} | RSS MiB {rss}"
        )


# --- logs ------------------------------------------------------------------------------------


def scan_log(path: Path) -> dict[str, Any]:
    """Warnings, errors and tracebacks in a process log, with a few distinct examples."""
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {"missing": True}
    for line in lines:
        for level in (" WARNING ", " ERROR ", " CRITICAL ", "Traceback"):
            if level in line:
                counts[level.strip()] += 1
                text = line.split(" ", 2)[-1] if level != "Traceback" else line
                examples.setdefault(text[:160], line[:400])
    return {"lines": len(lines), "counts": dict(counts), "examples": list(examples.values())[:8]}


def access_log_check(path: Path, offset: int) -> dict[str, Any]:
    """From the signed function's own access log: what it was sent, by classification.

    Read from ``offset``, where the load began (the start-up probes come before). A request that
    is not labelled public and got anything but 401 was served by the function: it left the
    premises. A 401 is the signature check refusing an unsigned request before anything is served:
    the soak's own direct connections to the function.
    """
    seen: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    served_not_public = refused_not_public = 0
    examples: list[str] = []
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return {"missing": True}
    for line in text.splitlines():
        if not line.startswith('{"event": "request"'):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        label = (entry.get("headers") or {}).get(CLASSIFICATION)
        seen[str(label)] += 1
        statuses[str(entry.get("status"))] += 1
        if label == "public" or entry.get("path") == "/spillway/metrics":  # the soak's own scrapes
            continue
        if entry.get("status") == 401:
            refused_not_public += 1
            continue
        served_not_public += 1
        if len(examples) < 5:
            examples.append(line[:300])
    return {
        "by_classification": dict(seen),
        "statuses": dict(statuses),
        "served_not_public": served_not_public,
        "refused_not_public_401": refused_not_public,
        "served_not_public_examples": examples,
    }


# --- report ----------------------------------------------------------------------------------


def build_result(
    args: argparse.Namespace, meta: dict[str, Any], run: dict[str, Any], logs: dict[str, Any]
) -> dict[str, Any]:
    samples: list[dict[str, Any]] = run["samples"]
    totals: Tally = run["totals"]
    trickle_log: TrickleLog = run["trickle"]
    warmup = args.warmup_s if args.warmup_s < args.duration_s else args.duration_s / 3
    names = list(samples[0]["processes"])
    pids: dict[str, list[int]] = {n: [] for n in names}
    for s in samples:
        for n in names:
            pid = s["processes"][n].get("pid")
            if pid is not None and (not pids[n] or pids[n][-1] != pid):
                pids[n].append(pid)
    rss = {
        n: rss_verdict(
            [(s["t_s"], s["processes"][n].get("rss_mib")) for s in samples],
            warmup,
            args.rss_tolerance,
            pids[n],
        )
        for n in names
    }
    fds = {
        n: {
            "at_mark": next((s["processes"][n].get("fds") for s in samples if s["t_s"] >= warmup), None),
            "end": samples[-1]["processes"][n].get("fds"),
            "max": max((s["processes"][n].get("fds") or 0) for s in samples),
        }
        for n in names
    }
    summary = totals.summary(run["elapsed_s"])
    five_xx = {k: v for k, v in totals.statuses.items() if k >= 500 and k != 503}
    access = logs["access"]
    checks = {
        "rss_flat": all(v["ok"] for v in rss.values()),
        "every_request_answered": totals.sent == totals.answered and not totals.transport,
        "no_5xx_but_503": not five_xx,
        "statuses_as_expected": not totals.unexpected,
        "residency_by_decision_header": totals.residency_violations == 0,
        "residency_at_the_function": access.get("served_not_public") == 0,
        "every_answer_has_a_decision": totals.missing_decision == 0,
        "misbehaving_connections_closed_in_time": not trickle_log.overdue
        and not any("error" in k for k in trickle_log.outcomes),
    }
    series_mark = next((s["series"] for s in samples if s["t_s"] >= warmup), samples[0]["series"])
    return {
        "bench": "soak",
        "meta": meta,
        "warmup_s_used": warmup,
        "ok": all(checks.values()),
        "checks": checks,
        "totals": {
            **summary,
            "by_kind": dict(sorted(totals.by_kind.items())),
            "decisions": dict(sorted(totals.decisions.items())),
            "five_xx_but_503": {str(k): v for k, v in five_xx.items()},
            "examples": totals.examples,
            "client_connections_opened": run["client_connections"],
        },
        "rss": rss,
        "fds": fds,
        "metrics_series": {"at_mark": series_mark, "end": samples[-1]["series"]},
        "decisions_scraped": run["decisions_scraped"],
        "trickle": trickle_log.summary(),
        "logs": logs,
        "samples": samples,
    }


def print_report(result: dict[str, Any]) -> None:
    t = result["totals"]
    meta = result["meta"]
    print(
        f"soak, {meta['date']}, {meta['cpus']} CPUs, {meta['clients']} clients, "
        f"{result['samples'][-1]['t_s']:.0f} s, load avg {meta['loadavg_1m']} -> {meta.get('loadavg_1m_end')}"
    )
    print(
        f"requests: {t['sent']} sent, {t['answered']} answered, {t['requests_per_s']:.1f}/s, "
        f"p50 {t['p50_ms']:.1f} ms, p99 {t['p99_ms']:.1f} ms, max {t['max_ms']:.1f} ms"
    )
    print(f"statuses: {t['statuses']}")
    print(f"decisions: {t['decisions']}")
    if t["unexpected"] or t["transport_errors"]:
        print(f"unexpected: {t['unexpected']} transport: {t['transport_errors']}")
    rows = [
        [
            name,
            v.get("at_mark_mib", math.nan),
            v.get("end_mib", math.nan),
            v.get("min_mib", math.nan),
            v.get("max_mib", math.nan),
            v.get("max_deviation_pct", math.nan),
            f"{v.get('slope_mib_per_min', math.nan):+.3f}",
            f"{v.get('late_slope_mib_per_min', math.nan):+.3f}",
            result["fds"][name]["at_mark"],
            result["fds"][name]["end"],
            "ok" if v["ok"] else f"NOT ok: {v['why']}",
        ]
        for name, v in result["rss"].items()
    ]
    print(f"\nRSS (MiB) from the first sample at or after {result['warmup_s_used']:.0f} s")
    print(
        render_table(
            [
                "process",
                "at mark",
                "end",
                "min",
                "max",
                "max dev %",
                "MiB/min",
                "2nd half MiB/min",
                "fds mark",
                "fds end",
                "verdict",
            ],
            rows,
        )
    )
    print(f"\nmetrics series: {result['metrics_series']}")
    print(f"misbehaving connections: {result['trickle']['outcomes']}")
    print(f"closed after (s): {result['trickle']['closed_after_s']}")
    for name, scan in result["logs"].items():
        if name != "access" and scan.get("counts"):
            print(f"log {name}: {scan['counts']}")
            for line in scan["examples"][:3]:
                print(f"    {line}")
    print(f"function access log: {result['logs']['access'].get('by_classification')}")
    print()
    for name, ok in result["checks"].items():
        print(f"{name}: {'ok' if ok else 'NOT ok'}")
    print(f"\nverdict: {'PASS' if result['ok'] else 'FAIL'}")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where installed, as the servers under test use it, so the client costs less CPU."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Soak the hybrid on loopback: a signed function and an on-prem function (each "
        "with its Triton sidecar) behind the development gateway and its runner, under a closed "
        "loop of keep-alive clients with hostile variety and a trickle of misbehaving connections. "
        "Samples every process's RSS and checks it stays flat after the warm-up, that every request "
        "got its expected answer and that nothing confidential left. Progress on stderr, a summary "
        "on stdout, the time series in --out. Exit 1 when a check fails.",
        epilog="A quick run: python bench/soak.py --duration-s 30 (the warm-up is then a third of it).",
    )
    parser.add_argument("--duration-s", type=float, default=600.0, help="load duration (default 600)")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop keep-alive clients (default 8)")
    parser.add_argument("--sample-s", type=float, default=10.0, help="sampling period (default 10)")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=60.0,
        help="RSS is judged against its value at this mark (default 60; a third of the run when "
        "the run is not longer). The signed function's replay cache fills for 300 s: 310 judges "
        "after it",
    )
    parser.add_argument(
        "--rss-tolerance", type=float, default=0.10, help="allowed relative RSS change (default 0.10)"
    )
    parser.add_argument(
        "--trickle-every-s",
        type=float,
        default=2.0,
        help="start one misbehaving connection this often (default 2; 0 turns the trickle off)",
    )
    parser.add_argument(
        "--max-tenants",
        type=int,
        default=1000,
        help="the runner's tenants.max_tracked; low, so that never-seen tenants fill it during "
        "the warm-up and its eviction runs for the rest of the soak (default 1000)",
    )
    parser.add_argument(
        "--request-timeout-s", type=float, default=30.0, help="a request unanswered this long fails"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the request mix (default 1)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "out" / "soak.json", help="result file (JSON)"
    )
    parser.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="folder for the processes' logs (default: next to --out, <name>-logs)",
    )
    args = parser.parse_args(argv)
    if args.duration_s <= 0 or args.sample_s <= 0 or args.clients < 1:
        parser.error("--duration-s, --sample-s and --clients must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logs_dir = args.logs or args.out.with_name(args.out.stem + "-logs")
    work = Path(tempfile.mkdtemp(prefix="spillway-soak-"))
    soak = Soak(args, work)
    meta: dict[str, Any] = {
        **machine_note(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "duration_s": args.duration_s,
        "clients": args.clients,
        "sample_s": args.sample_s,
        "warmup_s": args.warmup_s,
        "rss_tolerance": args.rss_tolerance,
        "trickle_every_s": args.trickle_every_s,
        "max_tenants": args.max_tenants,
        "seed": args.seed,
        "server_limits": HttpLimits().__dict__,
    }
    shm_before = shm_regions()
    try:
        with running([]) as launched:
            soak.start(launched)
            say(
                f"load for {args.duration_s:.0f} s with {args.clients} clients; "
                f"samples every {args.sample_s:.0f} s"
            )
            with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                run = runner.run(soak.load(soak.watched()))
            say("load done; stopping the processes")
        meta["loadavg_1m_end"] = machine_note()["loadavg_1m"]
        logs_dir.mkdir(parents=True, exist_ok=True)
        for item in work.iterdir():
            if item.is_file():
                shutil.copy2(item, logs_dir / item.name)
        logs = {
            "function": scan_log(work / "function.log"),
            "onprem": scan_log(work / "onprem.log"),
            "devgateway_and_runner": scan_log(work / "devgateway.log"),
            "access": access_log_check(work / "function.log", soak.function_log_offset),
        }
    except BaseException:
        for name in ("function.log", "onprem.log", "devgateway.log"):
            tail = (
                (work / name).read_text(errors="replace").splitlines()[-20:] if (work / name).exists() else []
            )
            if tail:
                say(f"{name} tail:\n" + "\n".join(tail))
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        warn_leaked(shm_before)
    result = build_result(args, meta, run, logs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(finite(result), indent=1, allow_nan=False) + "\n")
    print_report(result)
    print(f"\nresult: {args.out}; logs: {logs_dir}")
    return 0 if result["ok"] else 1


def finite(value: Any) -> Any:
    """The result with NaN and infinities as null, so that the file is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
