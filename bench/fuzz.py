"""Fuzz campaigns against the runner's ext-plugin socket and the function's HTTP/1.1 server.

    python bench/fuzz.py runner --frames 1000000 [--seed 1] [--json-out FILE]
    python bench/fuzz.py http --requests 100000 [--seed 1] [--target echo|function] [--json-out FILE]

Both campaigns use a seeded, structured generator (``random.Random``: one stream per lane, so what a
lane generates is reproducible from the seed; which conf tokens it reuses depends on how the lanes
interleave), check their invariants continuously, print progress on stderr, print a JSON summary on
stdout and exit 1 on any invariant violation.

Runner: ``python -m gateway_plugin run`` started as APISIX starts it (``APISIX_LISTEN_ADDRESS``,
a ``SPILLWAY_ROUTE_TOKEN`` of 64 hex digits derived from the seed), with two upstream-mode
targets, rules that send some requests to them, tenants under quotas, and a fake Triton metrics
endpoint whose load swings between calm and overloaded, so the spillway plugin's whole decision
path runs. Lanes, each on its own connections over the real Unix socket:

- well-formed: frames built with ``gateway_plugin.protocol.encode`` (random paths, headers,
  tokens, ids, plugin names and JSON confs), played as APISIX plays them, sometimes a few at once
  or split into small writes; ExtraInfo questions are answered (now and then with garbage). Every
  call must get exactly one answer frame, in order, of its own type or RPC_ERROR, with its id; no
  answer may send a request whose class may not leave (``x-data-classification`` other than
  ``public``, or none) to a cloud target; a route that is on-prem only never leaves; every
  ``spillway`` answer is a Stop (429/503) or sets ``X-Spillway-Target`` to ``local`` or a target's
  MAC'd value. The runner never closes these connections.
- mutated: the same frames with their payload mutated (bit flips, truncation, splices, poisoned
  offsets, random bytes) or their type changed, framing intact, one at a time: each still gets
  exactly one decodable answer and the connection stays open.
- chaos: byte streams with wrong lengths, partial frames, random bytes, floods past the backlog;
  the runner may close these, and whatever it sends must still be whole, decodable frames.
- probe: every ``--probe-every`` frames a new connection runs a known-good PrepareConf and
  HTTPReqCall (and a confidential one that must stay local).

The runner process must stay alive, its RSS (``/proc/<pid>/status`` VmRSS) within
``--max-rss-growth-mib`` of its level after start-up, its log free of unhandled exceptions, and it
must exit cleanly on SIGTERM at the end.

HTTP: ``functions.http_server.serve`` in a child process with an echo handler (``--target echo``;
the handler echoes a sequence header and a digest of the body it saw) under tight ``HttpLimits``,
or the real function with Triton (``--target function``: ``python -m functions serve --platform
local``). Scripts of pipelined requests: good ones, ones over the head, header-count and body
limits, Upgrade, CONNECT, odd methods, targets and header bytes, duplicate and conflicting
Content-Length / Transfer-Encoding with a smuggled request inside, bad chunk sizes, truncated and
slowly sent requests; a storm of connections past the connection cap. Every complete request is
answered exactly once and in order (or the connection is refused with a 4xx and closed where the
request is malformed), no smuggled request is answered, no 5xx but 503 at the connection cap,
no body after an answer to HEAD, no interim 100 ahead of an earlier request's answer, and the
server stays alive with bounded RSS. Against the real function answers carry no sequence number:
they are counted in order instead. ``--no-head`` and ``--no-pipelined-expect`` leave out the two
known deviations (HEAD answers with a body, 100 Continue ahead of earlier answers).

Violations carry the lane, its seed and the bytes sent (and received); ``--artifacts DIR`` keeps
them in full. ``http-replay --seed S --lane L --script N`` runs an HTTP violation's script again
(its ``where`` reads S:http:L#N).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import resource
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from functions.cli import serve_command
from functions.contract import PathError, gateway_path
from functions.http_types import Request, Response
from functions.settings import HttpLimits
from gateway_plugin.books.target_header import target_value
from gateway_plugin.protocol import encode, messages, schema
from gateway_plugin.protocol.frames import ErrCode, FrameType, frame
from gateway_plugin.request.header_names import FRAMING

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_REPOSITORY = ROOT / "examples" / "model_repository"

CLASSIFICATION = "x-data-classification"
TARGET_HEADER = "x-spillway-target"
TENANT_HEADER = "x-tenant"
LOCAL = "local"
TARGETS = ("aws", "fc")
CONF_CACHE_ENTRIES = 100_000  # gateway_plugin.runner.conf_cache.ConfCache.max_entries


# Shared: findings, RSS, progress


class Findings:
    """Invariant violations by kind, with the first few of each kept in full."""

    def __init__(self, artifacts: Path | None, keep: int = 5) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: list[dict[str, Any]] = []
        self._kept: Counter[str] = Counter()
        self._keep = keep
        self._artifacts = artifacts

    def add(self, kind: str, sent: bytes = b"", received: bytes = b"", **detail: Any) -> None:
        self.counts[kind] += 1
        if self._kept[kind] >= self._keep:
            return
        self._kept[kind] += 1
        example: dict[str, Any] = {"kind": kind, **detail}
        if sent:
            example["sent_bytes"] = len(sent)
            example["sent_hex"] = sent[:2048].hex()
        if received:
            example["received_bytes"] = len(received)
            example["received_hex"] = received[:2048].hex()
        if self._artifacts is not None and (sent or received):
            self._artifacts.mkdir(parents=True, exist_ok=True)
            name = f"{kind}-{self._kept[kind]}.json"
            full = {**example, "sent_hex": sent.hex(), "received_hex": received.hex()}
            (self._artifacts / name).write_text(json.dumps(full, indent=1, default=str))
            example["artifact"] = str(self._artifacts / name)
        self.examples.append(example)
        print(f"\nVIOLATION {kind}: {json.dumps(detail, default=str)[:400]}", file=sys.stderr, flush=True)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> dict[str, Any]:
        return {"count": self.total, "by_kind": dict(self.counts), "examples": self.examples}


def rss_kib(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Rss:
    """A process's resident memory: after start-up, at its peak, at the end, and at every tenth of
    the campaign (with what else grew by then)."""

    start_kib: int = 0
    peak_kib: int = 0
    end_kib: int = 0
    timeline: list[dict[str, int]] = field(default_factory=list)

    def sample(self, pid: int) -> None:
        now = rss_kib(pid)
        if now is None:
            return
        if not self.start_kib:
            self.start_kib = now
        self.peak_kib = max(self.peak_kib, now)
        self.end_kib = now

    def track(self, done: int, goal: int, **extra: int) -> None:
        """Note the latest sample each time the campaign passes another tenth of its goal."""
        if done * 10 >= goal * (len(self.timeline) + 1) and len(self.timeline) < 10:
            self.timeline.append({"done": done, "rss_kib": self.end_kib, **extra})

    @property
    def growth_mib(self) -> float:
        return (self.peak_kib - self.start_kib) / 1024

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "growth_mib": round(self.growth_mib, 1)}


class Progress:
    """One status line on a terminal; a line every 10 s elsewhere; nothing when quiet."""

    def __init__(self, enabled: bool, unit: str) -> None:
        self.enabled = enabled
        self.unit = unit
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self._last = (self.started, 0)
        self._printed = 0.0

    def show(self, done: int, goal: int, extra: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not self.tty and now - self._printed < 10:
            return
        last_t, last_n = self._last
        rate = (done - last_n) / max(now - last_t, 1e-6)
        self._last = (now, done)
        self._printed = now
        line = (
            f"{done:>10,}/{goal:,} {self.unit} {rate:>8,.0f}/s "
            f"(avg {done / max(now - self.started, 1e-6):,.0f}/s) {extra}"
        )
        print(("\r" + line + "\x1b[K") if self.tty else line, end="" if self.tty else "\n", file=sys.stderr)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)


def _log_summary(path: Path) -> dict[str, Any]:
    """Counts by level from a process's log, and the unhandled exceptions it recorded."""
    levels: Counter[str] = Counter()
    tracebacks = 0
    never_retrieved = 0
    first: list[str] = []
    unhandled: list[str] = []
    level_of = re.compile(r" (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
    lines = 0
    with path.open("r", errors="replace") as log:
        for line in log:
            lines += 1
            match = level_of.search(line[:80])
            if match:
                levels[match.group(1)] += 1
                if match.group(1) in ("ERROR", "CRITICAL") and len(first) < 10:
                    first.append(line.rstrip()[:300])
            if line.startswith("Traceback"):
                tracebacks += 1
            if "exception was never retrieved" in line:
                never_retrieved += 1
            unhandled_marks = ("Fatal error", "Exception in callback", "Task exception was never retrieved")
            if len(unhandled) < 10 and any(mark in line for mark in unhandled_marks):
                unhandled.append(line.rstrip()[:300])
    return {
        "lines": lines,
        "by_level": dict(levels),
        "tracebacks": tracebacks,
        "never_retrieved": never_retrieved,
        "unhandled": unhandled,
        "first_errors": first,
    }


def _new_loop() -> asyncio.AbstractEventLoop:
    from functions.loop import new_event_loop

    return new_event_loop()


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left (connections still open to a stopped peer), then close."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


# Runner: what the generator builds


@dataclass(frozen=True)
class ConfInfo:
    """What a PrepareConf asked for, as far as the generator knows it."""

    spillway: bool
    on_prem_only: bool | None  # None: unknown (a conf the generator does not fully predict)
    expect: str  # "ok", "bad" or "either"


@dataclass
class GenRequest:
    """An HTTPReqCall's contents and what the residency rule allows for them."""

    path: str
    headers: list[tuple[str, str | None]]
    args: list[tuple[str, str | None]]
    method: int
    src_ip: bytes
    may_leave: bool


@dataclass
class Call:
    ty: int
    payload: bytes
    kind: str  # prepare, req, resp, stray-info
    call_id: int = 0
    token: int = 0
    conf: ConfInfo | None = None
    request: GenRequest | None = None
    garbage_info: bool = False
    token_valid: bool = False  # the token was surely in the runner's cache when the call was made


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def may_leave(headers: list[tuple[str, str | None]]) -> bool:
    """The residency rule, as the config states it: only ``public`` leaves; no label stays home.

    Repeated headers are joined with ", " (as APISIX presents them); entries without a value are
    not headers at all."""
    values = [v for k, v in headers if v is not None and k.lower().replace("_", "-") == CLASSIFICATION]
    return bool(values) and ", ".join(values).strip().lower() == "public"


def refused(request: GenRequest) -> bool:
    """Whether one reading of the request is impossible, so the runner must answer 400: a path
    encoded more than once or not in normal form, a tenant named with different values, an ``_``
    spelling of a header nginx frames the body by."""
    try:
        gateway_path(request.path or "/")  # an empty path reaches the runner as "/"
    except PathError:
        return True
    names = [(k.lower(), v) for k, v in request.headers if v is not None]
    tenants = {v for k, v in names if k.replace("_", "-") == TENANT_HEADER}
    framing = any("_" in k and k.replace("_", "-") in FRAMING for k, _ in names)
    return len(tenants) > 1 or framing


MODELS = ["m0", "burst", "add_sub", "m.v2", "%6d0", "m\u00f6del", "a%2Fb", "..", ".", "burst%00", "BURST", ""]
PUBLIC_LABELS = ["public", "PUBLIC", " public", "public ", "\tpublic", "Public"]
OTHER_LABELS = [
    "confidential",
    "Confidential",
    "secret",
    "",
    " ",
    "public, confidential",
    "confidential, public",
    "publ\u0456c",  # Cyrillic i
    "\uff50\uff55\uff42\uff4c\uff49\uff43",  # full-width
    "public\x00",
    "pub lic",
    "public;q=1",
    "publicx",
    "PUBL\u0130C",
    "public\udcff",
]
ROUTE_VALUES = ["cloud", "cloud-x", "cloudy", "shed", "local", "CLOUD", "", "cloud\n"]
TENANTS = ["gold", "tiny", "search", "", "t\u00e9nant", "x" * 300]
VAR_NAMES = {"http_x_spillway_target", "http_x_tenant", "upstream_response_time", "uri"}
PLUGIN_NAMES_BAD = [
    "",
    "Spillway",
    "spillway\x00",
    "nope",
    "../spillway",
    "spillw\u0430y",
    "spillway ",
    "HEADERS",
]
HEADER_NAMES = ["x-team", "cookie", "authorization", "x-a", "X-B", "x-\u00e9", "", "x-data-classification"]
RESPONSE_TIMES = ["0.012", "0.5, 0.3", "nan", "-1", "1e400", "abc", "", ",", "0.1 : 0.2", "inf"]


class ProtocolGen:
    """Random but well-formed ext-plugin messages, and the mutations of them."""

    def __init__(self, rng: random.Random, target_values: dict[str, str]) -> None:
        self.rng = rng
        self.target_values = target_values

    # Scalars and text

    def u32(self) -> int:
        r = self.rng.random()
        if r < 0.05:
            return self.rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF])
        return self.rng.getrandbits(32)

    def raw_text(self, n: int) -> str:
        """Arbitrary bytes as the runner decodes them (UTF-8 with surrogate escapes)."""
        return self.rng.randbytes(n).decode("utf-8", "surrogateescape")

    def word(self, lo: int = 1, hi: int = 12) -> str:
        alphabet = string.ascii_letters + string.digits + "-_.%~"
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(lo, hi)))

    def text(self) -> str:
        r = self.rng.random()
        if r < 0.6:
            return self.word(0, 24)
        if r < 0.75:
            return self.raw_text(self.rng.randint(0, 24))
        if r < 0.9:
            return self.rng.choice(["\u6a21\u578b", "\U0001f600", "\x00", "\r\n", "%00", "%ff", "\\", '"'])
        return self.word(1, 4) * self.rng.randint(100, 2000)

    # Requests

    def model(self) -> str:
        if self.rng.random() < 0.3:
            return f"m{self.rng.randrange(1_000_000)}"
        return self.rng.choice(MODELS)

    def path(self) -> str:
        rng = self.rng
        r = rng.random()
        model = self.model()
        if r < 0.45:
            return f"/v2/models/{model}/infer"
        if r < 0.55:
            return f"/v2/models/{model}/versions/{rng.randint(0, 3)}/infer"
        options = [
            "/v2/repository/index",
            "//v2/./%72epository/index",
            "/v2/%2572epository/index",
            "/v2/models/../repository/index",
            f"/v2/models/{model}/%2e%2e/%2e%2e/repository/index",
            "/v2/models/%E6%A8%A1%E5%9E%8B/infer",
            "/v2/models/\u6a21\u578b/infer",
            "",
            "/",
            "%",
            "%%",
            "%zz",
            "/v2/models/" + "%25" * rng.randint(1, 30) + "32/infer",
            "/"
            + "/".join(rng.choice([".", "..", "", "a", "%2e", "%2E%2E"]) for _ in range(rng.randint(1, 12))),
            "/v2/models/" + self.raw_text(rng.randint(1, 40)) + "/infer",
            "/a" * rng.randint(1000, 20_000),
            "/v2/models/burst/infer?route=cloud",
        ]
        return rng.choice(options)

    def headers(self) -> list[tuple[str, str | None]]:
        rng = self.rng
        out: list[tuple[str, str | None]] = []
        r = rng.random()
        if r < 0.35:
            out.append(
                (
                    rng.choice([CLASSIFICATION, "X-Data-Classification", "X-DATA-CLASSIFICATION"]),
                    rng.choice(PUBLIC_LABELS),
                )
            )
        elif r < 0.8:
            out.append((CLASSIFICATION, rng.choice(OTHER_LABELS)))
        if rng.random() < 0.1:  # a second label, or a label without a value
            out.append(
                (
                    rng.choice([CLASSIFICATION, "X-Data-Classification"]),
                    rng.choice([*PUBLIC_LABELS, *OTHER_LABELS, None]),
                )
            )
        if rng.random() < 0.05:
            out.append((CLASSIFICATION + rng.choice([" ", "_", "\x00", "s"]), "public"))
        if rng.random() < 0.6:
            out.append(("x-fuzz-route", rng.choice(ROUTE_VALUES)))
        if rng.random() < 0.4:
            tenant = rng.choice(TENANTS) if rng.random() < 0.5 else f"tenant-{rng.randrange(100_000)}"
            out.append((TENANT_HEADER, tenant))
        if rng.random() < 0.15:  # a client that tries to pick its own target
            forged = rng.choice([*self.target_values.values(), "aws", "fc", "aws:" + "0" * 32, LOCAL, ""])
            out.append((rng.choice([TARGET_HEADER, "X-Spillway-Target"]), forged))
        for _ in range(rng.choice([0, 0, 1, 2, 4, 8])):
            out.append((self.text(), self.text() if rng.random() < 0.9 else None))
        r = rng.random()
        if r < 0.01:
            out.extend((f"x-h{i}", "v" * rng.randint(0, 8)) for i in range(rng.randint(500, 3000)))
        elif r < 0.02:
            out.append(("x-big", "b" * rng.randint(10_000, 100_000)))
        rng.shuffle(out)
        return out

    def args(self) -> list[tuple[str, str | None]]:
        rng = self.rng
        out: list[tuple[str, str | None]] = []
        if rng.random() < 0.15:
            out.append(("route", rng.choice(["cloud", "local", "CLOUD", ""])))
        for _ in range(rng.choice([0, 0, 1, 3])):
            out.append((self.text(), self.text() if rng.random() < 0.8 else None))
        return out

    def request(self) -> GenRequest:
        rng = self.rng
        headers = self.headers()
        method = rng.randint(0, 12) if rng.random() < 0.9 else rng.randint(0, 255)
        src_ip = rng.choice([bytes([127, 0, 0, 1]), bytes(16), b"", rng.randbytes(rng.choice([4, 16, 3, 7]))])
        return GenRequest(self.path(), headers, self.args(), method, src_ip, may_leave(headers))

    def req_call(self, token: int, request: GenRequest | None = None) -> Call:
        request = request or self.request()
        call_id = self.u32()
        payload = encode.req_call(
            call_id, token, request.method, request.path, request.args, request.headers, request.src_ip
        )
        return Call(FrameType.HTTP_REQ_CALL, payload, "req", call_id, token, request=request)

    def resp_call(self, token: int) -> Call:
        rng = self.rng
        call_id = self.u32()
        status = rng.choice([200, 204, 404, 500, 502, 503, 0, 65535, rng.randint(0, 65535)])
        headers: list[tuple[str, str | None]] = []
        if rng.random() < 0.5:
            headers.append(("x-spillway-instance", rng.choice(["i-1", "i-2", self.word()])))
        if rng.random() < 0.3:
            headers.append(("x-spillway-cold", rng.choice(["1", "0", ""])))
        for _ in range(rng.choice([0, 1, 3])):
            headers.append((self.text(), self.text() if rng.random() < 0.9 else None))
        payload = encode.resp_call(call_id, token, status, headers)
        return Call(FrameType.HTTP_RESP_CALL, payload, "resp", call_id, token)

    # Confs

    def spillway_conf(self) -> tuple[str | None, bool | None, str]:
        """(JSON conf, on-prem only, expectation)."""
        rng = self.rng
        r = rng.random()
        if r < 0.6:
            conf: dict[str, Any] = {}
            if rng.random() < 0.3:
                conf["latency_target_ms"] = rng.choice([0.001, 1, 50, 200, 1e9])
            if rng.random() < 0.3:
                conf["targets"] = rng.sample(["aws", "fc", "nope", ""], rng.randint(0, 3))
            if rng.random() < 0.3:
                conf["rules"] = rng.sample(
                    ["cloud", "burst", "by-arg", "shed", "admin-stays", "x"], rng.randint(0, 4)
                )
            if rng.random() < 0.4:
                conf["on_prem_only"] = rng.random() < 0.5
            return json.dumps(conf), bool(conf.get("on_prem_only", False)), "ok"
        if r < 0.65:
            return None, False, "ok"  # no value: an empty conf
        if r < 0.8:
            bad: Any = rng.choice(
                [
                    {"latency_target_ms": 0},
                    {"latency_target_ms": -1},
                    {"unknown": 1},
                    {"targets": "aws"},
                    {"rules": [1, 2]},
                    {"on_prem_only": [True]},
                    [],
                    "x",
                    None,
                ]
            )
            return json.dumps(bad), None, "bad"
        return self.random_json_text(), None, "either"

    def headers_conf(self) -> tuple[str, str]:
        rng = self.rng
        names = [n for n in HEADER_NAMES if n.lower() != TARGET_HEADER]
        if rng.random() < 0.8:
            conf: dict[str, Any] = {}
            if rng.random() < 0.6:
                conf["set"] = {rng.choice(names): self.text() for _ in range(rng.randint(0, 3))}
            if rng.random() < 0.4:
                conf["delete"] = rng.sample(names, rng.randint(0, 3))
            if rng.random() < 0.4:
                conf["response"] = {rng.choice(names): self.word() for _ in range(rng.randint(0, 2))}
            text = json.dumps(conf)
            # JSON cannot carry lone surrogates (bytes that were not UTF-8): then either answer goes.
            return text, "ok" if _utf8(text) and all(
                _utf8(v) for v in conf.get("set", {}).values()
            ) else "either"
        return self.random_json_text(), "either"

    def random_json(self, depth: int = 0) -> Any:
        rng = self.rng
        r = rng.random()
        if depth < 3 and r < 0.25:
            return {self.word(0, 10): self.random_json(depth + 1) for _ in range(rng.randint(0, 4))}
        if depth < 3 and r < 0.4:
            return [self.random_json(depth + 1) for _ in range(rng.randint(0, 4))]
        return rng.choice([None, True, False, 0, -1, 1.5, 1e308, "", self.word(), self.text()])

    def random_json_text(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.7:
            return json.dumps(self.random_json())
        return rng.choice(
            ["{", "", "null", "\x00", '{"latency_target_ms": 1e999}', "{}" * 3, self.raw_text(20)]
        )

    def prepare(self) -> Call:
        rng = self.rng
        parts: list[tuple[str, str | None, bool | None, str]] = []
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            r = rng.random()
            if r < 0.6:
                conf, prem, how = self.spillway_conf()
                parts.append(("spillway", conf, prem, how))
            elif r < 0.85:
                conf, how = self.headers_conf()
                parts.append(("headers", conf, False, how))
            else:
                parts.append((rng.choice(PLUGIN_NAMES_BAD), "{}", False, "bad"))
        if rng.random() < 0.3:
            rng.shuffle(parts)
        hows = {how for *_, how in parts}
        expect = "bad" if "bad" in hows else "either" if "either" in hows else "ok"
        # The last spillway entry has the last word on X-Spillway-Target.
        last = next((p for p in reversed(parts) if p[0] == "spillway"), None)
        info = ConfInfo(last is not None, False if last is None else last[2], expect)
        key = rng.choice(["route#1", "", self.text(), f"route#{rng.randrange(10**6)}"])
        payload = encode.prepare_conf(key, [(name, conf) for name, conf, _, _ in parts])
        return Call(FrameType.PREPARE_CONF, payload, "prepare", conf=info)

    # ExtraInfo answers

    def var_value(self, name: str | None) -> bytes | None:
        rng = self.rng
        if rng.random() < 0.2:
            return None
        if name == "http_x_spillway_target":
            options = [*self.target_values.values(), LOCAL, "aws", self.word()]
            return rng.choice(options).encode()
        if name == "http_x_tenant":
            return rng.choice(TENANTS).encode("utf-8", "surrogateescape")
        if name == "upstream_response_time":
            return rng.choice(RESPONSE_TIMES).encode()
        if name == "uri":
            return self.path().encode("utf-8", "surrogateescape")
        return self.text().encode("utf-8", "surrogateescape")

    def garbage(self, hi: int = 64) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, hi))

    # Mutations: the payload changes, the framing stays

    def mutate(self, ty: int, payload: bytes) -> tuple[int, bytes]:
        rng = self.rng
        data = bytearray(payload)
        how = rng.random()
        if how < 0.25 and data:
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(len(data))
                data[at] ^= 1 << rng.randrange(8)
        elif how < 0.4 and data:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.getrandbits(8)])
        elif how < 0.5:
            data = data[: rng.randint(0, len(data))]
        elif how < 0.58:
            data += self.garbage(256)
        elif how < 0.68 and len(data) >= 4:
            start = rng.randrange(len(data))
            end = min(len(data), start + rng.randint(1, 16))
            data[start:end] = self.garbage(16)
        elif how < 0.85 and len(data) >= 8:
            at = rng.randrange(0, len(data) - 3) & ~3
            value = rng.choice([0, 0xFFFFFFFF, 0x7FFFFFFF, len(data), len(data) - 4, 4, rng.getrandbits(32)])
            data[at : at + 4] = value.to_bytes(4, "little")
        elif how < 0.9:
            data = bytearray(self.garbage(512))
        else:
            data = bytearray()
        if rng.random() < 0.12:
            ty = rng.choice([0, 1, 2, 3, 4, rng.randint(5, 255)])
        return ty, bytes(data)


# Runner: the campaign


@dataclass
class RunnerOptions:
    frames: int = 1_000_000
    seed: int = 1
    wellformed_lanes: int = 6
    mutated_lanes: int = 3
    chaos_lanes: int = 6
    probe_every: int = 5_000
    chaos_linger_s: float = 0.5
    answer_timeout_s: float = 60.0
    max_rss_growth_mib: float = 384.0
    metrics_feed: bool = True
    progress: bool = True
    artifacts: Path | None = None
    workdir: Path | None = None


class Closed(Exception):
    """The other side closed the connection."""


class Wire:
    """One connection to the runner, read frame by frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, path: Path) -> Wire:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 24)
        return cls(reader, writer)

    async def frame(self) -> tuple[int, bytes]:
        try:
            head = await self.reader.readexactly(4)
            length = int.from_bytes(head[1:], "big")
            payload = await self.reader.readexactly(length) if length else b""
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise Closed(str(exc)) from None
        return head[0], payload

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class TokenBook:
    """Conf tokens handed out, with what their confs hold where the generator knows it.

    Tokens come from one counter and the conf cache keeps the newest ``CONF_CACHE_ENTRIES``; a
    token well inside that window must still be there."""

    def __init__(self) -> None:
        self.confs: dict[int, ConfInfo] = {}
        self.highest = 0
        self.recent: list[int] = []

    def issued(self, token: int, conf: ConfInfo | None) -> None:
        self.highest = max(self.highest, token)
        if conf is not None:
            self.confs[token] = conf
            self.recent.append(token)
            if len(self.recent) > 512:
                drop = self.recent.pop(0)
                self.confs.pop(drop, None)

    def surely_valid(self, token: int) -> bool:
        return token in self.confs and self.highest - token < CONF_CACHE_ENTRIES // 2


def runner_config(metrics_url: str | None) -> dict[str, Any]:
    """Two upstream-mode targets, rules that send some requests out, quotas, and a load feed."""
    config: dict[str, Any] = {
        "runner": {"conf_ttl_s": 3600},
        "targets": [
            {
                "name": "aws",
                "kind": "http",
                "url": "https://fn.example",
                "signing_key_env": None,
                "concurrency_cap": 1_000_000,
                "timeout_s": 2.0,
            },
            {
                "name": "fc",
                "kind": "http",
                "url": "https://fc.example",
                "signing_key_env": None,
                "concurrency_cap": 4,
                "timeout_s": 2.0,
                "cold_start_ms": 50,
            },
        ],
        "rules": [
            {"name": "admin-stays", "priority": 10, "match": {"uri": "^/v2/repository"}, "action": "local"},
            {"name": "shed", "priority": 9, "match": {"headers": {"x-fuzz-route": "shed"}}, "action": "shed"},
            {
                "name": "cloud",
                "priority": 5,
                "match": {"headers": {"x-fuzz-route": "cloud.*"}},
                "action": "target",
                "targets": ["aws", "fc"],
            },
            {
                "name": "burst",
                "priority": 4,
                "match": {"models": ["burst"]},
                "action": "target",
                "targets": ["fc", "aws"],
            },
            {
                "name": "by-arg",
                "priority": 3,
                "match": {"args": {"route": "cloud"}},
                "action": "target",
                "targets": ["aws"],
            },
        ],
        "residency": {"header": CLASSIFICATION, "cloud_allowed": ["public"], "unclassified_may_leave": False},
        "tenants": {
            "header": TENANT_HEADER,
            "default": {"requests_per_minute": 1_000_000},
            "quotas": {"gold": {"concurrency": 2}, "tiny": {"requests_per_minute": 5}},
            "max_tracked": 500,
        },
        "breaker": {"consecutive_failures": 20, "cooldown_s": 0.5, "max_cooldown_s": 2.0},
        "budgets": {"per_target_hourly_usd": {"fc": 0.05}},
        "local": {"model_latency_targets_ms": {"m0": 50, "burst": 20}, "scrape_period_s": 0.25},
        "metrics": {"listen": None},
    }
    if metrics_url:
        config["local"]["endpoints"] = [{"url": "http://127.0.0.1:1", "metrics_url": metrics_url}]
    return config


class MetricsFeed:
    """A stand-in for Triton's /metrics whose load swings between calm and overloaded every 2 s."""

    def __init__(self) -> None:
        self.success = 0
        self.queue_us = 0
        self.compute_us = 0
        self.scrapes = 0
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/metrics"

    def text(self) -> str:
        hot = int(time.monotonic() / 2) % 2 == 1
        self.scrapes += 1
        self.success += 10
        self.queue_us += 10 * (800_000 if hot else 500)
        self.compute_us += 10 * 5_000
        lines = []
        for family, kind, value in (
            ("nv_inference_request_success", "counter", self.success),
            ("nv_inference_queue_duration_us", "counter", self.queue_us),
            ("nv_inference_compute_infer_duration_us", "counter", self.compute_us),
            ("nv_inference_pending_request_count", "gauge", 12 if hot else 0),
        ):
            lines.append(f"# TYPE {family} {kind}")
            for model in ("m0", "burst", "add_sub"):
                lines.append(f'{family}{{model="{model}",version="1"}} {value}')
        return "\n".join(lines) + "\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        self.writers.add(writer)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                body = self.text().encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n" % len(body)
                )
                writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.close()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=5)


@dataclass
class RunnerProcess:
    proc: subprocess.Popen[bytes]
    sock: Path
    log: Path
    route_token: str


def start_runner(workdir: Path, config: dict[str, Any], seed: int) -> RunnerProcess:
    """``python -m gateway_plugin run`` as APISIX's ext-plugin.cmd starts it.

    The route token is random-looking but derived from the seed, so that the MAC'd target values
    in the generated traffic are the same from run to run."""
    sock = workdir / "runner.sock"
    config_path = workdir / "spillway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = workdir / "runner.log"
    token = hashlib.sha256(f"spillway-fuzz-route-token:{seed}".encode()).hexdigest()
    env = {**os.environ, "APISIX_LISTEN_ADDRESS": f"unix:{sock}", "SPILLWAY_ROUTE_TOKEN": token}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway_plugin", "run", "--config", str(config_path)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the runner did not start: {log.read_text()[-2000:]}")
        time.sleep(0.02)
    return RunnerProcess(proc, sock, log, token)


class RunnerCampaign:
    def __init__(self, options: RunnerOptions, runner: RunnerProcess) -> None:
        self.o = options
        self.runner = runner
        token = runner.route_token.encode()
        self.target_values = {name: target_value(name, token) for name in TARGETS}
        self.allowed_targets = {LOCAL, *self.target_values.values()}
        self.findings = Findings(options.artifacts)
        self.tokens = TokenBook()
        self.rss = Rss()
        self.sent = 0
        self.lane_frames: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.decisions: Counter[str] = Counter()
        self.closes: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.probes = Counter[str]()
        self.aborted = False
        self.started = time.monotonic()
        self.cpu_start = own_cpu_s()

    def done(self) -> bool:
        return self.sent >= self.o.frames or self.aborted

    def count(self, lane: str, frames: int) -> None:
        self.sent += frames
        self.lane_frames[lane] += frames

    # Checking answers

    def check_answer(self, lane: str, call: Call, ty: int, payload: bytes, sent: bytes) -> None:
        """One call's answer frame: its kind, its decodability, its id and what it decides."""
        detail = {"lane": lane, "call": call.kind, "sent_type": call.ty}
        if ty == FrameType.RPC_ERROR:
            try:
                code = messages.err_code(payload)
            except messages.DecodeError as exc:
                self.findings.add("undecodable_error_frame", sent, payload, error=str(exc), **detail)
                return
            name = ErrCode(code).name if code in ErrCode._value2member_map_ else f"code-{code}"
            self.errors[name] += 1
            self.answers["rpc_error"] += 1
            self._check_error(lane, call, name, sent, payload, detail)
            return
        expected = (
            call.ty
            if call.ty in (FrameType.PREPARE_CONF, FrameType.HTTP_REQ_CALL, FrameType.HTTP_RESP_CALL)
            else None
        )
        if ty != expected:
            self.findings.add("wrong_answer_type", sent, payload, answer_type=ty, **detail)
            return
        try:
            if ty == FrameType.PREPARE_CONF:
                self._check_prepare(lane, call, messages.conf_token(payload), sent, detail)
            elif ty == FrameType.HTTP_REQ_CALL:
                self._check_req(lane, call, *messages.req_call_answer(payload), sent=sent, received=payload)
            else:
                answer = messages.resp_call_answer(payload)
                self.answers["resp_call"] += 1
                if lane == "wellformed" and answer.id != call.call_id:
                    self.findings.add(
                        "answer_id_mismatch", sent, payload, got=answer.id, want=call.call_id, **detail
                    )
        except messages.DecodeError as exc:
            self.findings.add("undecodable_answer", sent, payload, error=str(exc), answer_type=ty, **detail)

    def _check_error(
        self, lane: str, call: Call, name: str, sent: bytes, payload: bytes, detail: dict[str, Any]
    ) -> None:
        if name == "SERVICE_UNAVAILABLE":
            self.findings.add("plugin_failed", sent, payload, **detail)
            return
        if lane != "wellformed":
            calls = (FrameType.PREPARE_CONF, FrameType.HTTP_REQ_CALL, FrameType.HTTP_RESP_CALL)
            if call.ty not in calls and name != "BAD_REQUEST":
                self.findings.add("unexpected_error_code", sent, payload, code=name, **detail)
            return
        if call.kind == "stray-info":
            if name != "BAD_REQUEST":
                self.findings.add("unexpected_error_code", sent, payload, code=name, **detail)
        elif call.kind == "prepare":
            assert call.conf is not None
            if name != "BAD_REQUEST":
                self.findings.add("unexpected_error_code", sent, payload, code=name, **detail)
            elif call.conf.expect == "ok":
                self.findings.add("valid_conf_refused", sent, payload, **detail)
        elif name == "CONF_TOKEN_NOT_FOUND":
            if call.token_valid:
                self.findings.add(
                    "conf_token_lost", sent, payload, token=call.token, highest=self.tokens.highest, **detail
                )
        elif name == "BAD_REQUEST" and not (call.kind == "resp" and call.garbage_info):
            self.findings.add("wellformed_call_refused", sent, payload, code=name, **detail)

    def _check_prepare(self, lane: str, call: Call, token: int, sent: bytes, detail: dict[str, Any]) -> None:
        self.answers["prepare_conf"] += 1
        if token == 0:
            self.findings.add("zero_conf_token", sent, **detail)
        if lane == "wellformed":
            assert call.conf is not None
            if call.conf.expect == "bad":
                self.findings.add("invalid_conf_accepted", sent, **detail)
            self.tokens.issued(token, call.conf)
            call.token = token
        else:
            self.tokens.issued(token, None)

    def _check_req(
        self, lane: str, call: Call, answer_id: int, action: Any, *, sent: bytes, received: bytes
    ) -> None:
        detail: dict[str, Any] = {"lane": lane, "call": call.kind, "token": call.token}
        if lane == "wellformed" and answer_id != call.call_id:
            self.findings.add(
                "answer_id_mismatch", sent, received, got=answer_id, want=call.call_id, **detail
            )
        conf = self.tokens.confs.get(call.token)
        known = lane == "wellformed" and conf is not None and conf.spillway and call.request is not None
        must_refuse = known and call.request is not None and refused(call.request)
        if isinstance(action, messages.Stop):
            self.answers["req_call:stop"] += 1
            self.decisions[f"stop:{action.status}"] += 1
            expected = (400,) if must_refuse else (429, 503) if known else (400, 429, 503)
            if action.status not in expected:
                self.findings.add("unexpected_stop_status", sent, received, status=action.status, **detail)
            return
        if must_refuse:
            self.findings.add("refusal_missed", sent, received, **detail)
        targets = []
        if isinstance(action, messages.Rewrite):
            self.answers["req_call:rewrite"] += 1
            targets = [v for k, v in action.headers if k.lower() == TARGET_HEADER]
        else:
            self.answers["req_call:no_change"] += 1
        for value in targets:
            if value is not None and value not in self.allowed_targets:
                self.findings.add("forged_target_value", sent, received, value=value, **detail)
        decided = next((v for v in reversed(targets) if v is not None), None)
        name = (
            LOCAL
            if decided == LOCAL
            else next((n for n, v in self.target_values.items() if v == decided), None)
        )
        self.decisions[name or "none"] += 1
        if lane != "wellformed":
            return
        request = call.request
        assert request is not None
        if not request.may_leave:
            self.stats["residency_checked"] += 1
        if name is not None and name != LOCAL:
            if not request.may_leave:
                self.findings.add(
                    "residency_breach",
                    sent,
                    received,
                    target=name,
                    headers=[(k[:60], v if v is None else v[:60]) for k, v in request.headers[:20]],
                    **detail,
                )
            if conf is not None and conf.on_prem_only:
                self.findings.add("on_prem_route_left", sent, received, target=name, **detail)
        if conf is not None and conf.spillway and (decided is None or name is None):
            self.findings.add("spillway_answer_without_target", sent, received, targets=targets, **detail)

    # Lanes

    def answer_question(
        self,
        wire: Wire,
        gen: ProtocolGen,
        call: Call,
        payload: bytes,
        sent: bytes,
        lane: str,
        garbage_rate: float,
    ) -> None:
        self.answers["extra_info_question"] += 1
        try:
            kind, name = messages.extra_info_request(payload)
        except messages.DecodeError as exc:
            self.findings.add("undecodable_question", sent, payload, error=str(exc), lane=lane)
            return
        if kind == schema.Info.VAR and name not in VAR_NAMES:
            self.stats["question_for_other_var"] += 1
        if gen.rng.random() < garbage_rate:
            call.garbage_info = True
            answer = gen.garbage()
        elif kind == schema.Info.VAR:
            answer = encode.extra_info_answer(gen.var_value(name))
        else:
            answer = encode.extra_info_answer(gen.garbage(2048))
        wire.writer.write(frame(FrameType.EXTRA_INFO, answer))

    async def exchange(
        self,
        wire: Wire,
        gen: ProtocolGen,
        calls: list[Call],
        lane: str,
        chunked: bool = False,
        garbage_rate: float = 0.0,
    ) -> None:
        """Send the calls (at once, or in small writes), answer questions, check every answer."""
        for call in calls:
            call.token_valid = call.kind in ("req", "resp") and self.tokens.surely_valid(call.token)
        data = b"".join(frame(c.ty, c.payload) for c in calls)
        if chunked:
            at = 0
            while at < len(data):
                step = gen.rng.randint(1, 64)
                wire.writer.write(data[at : at + step])
                at += step
                await wire.writer.drain()
        else:
            wire.writer.write(data)
        self.count(lane, len(calls))
        async with asyncio.timeout(self.o.answer_timeout_s):
            for call in calls:
                while True:
                    ty, payload = await wire.frame()
                    if ty != FrameType.EXTRA_INFO:
                        break
                    self.answer_question(wire, gen, call, payload, data, lane, garbage_rate)
                self.check_answer(lane, call, ty, payload, data)

    def _token_for(self, gen: ProtocolGen, own: list[int]) -> int:
        r = gen.rng.random()
        if own and r < 0.85:
            return gen.rng.choice(own)
        if self.tokens.recent and r < 0.9:
            return gen.rng.choice(self.tokens.recent)
        if r < 0.95:
            return gen.u32()
        return gen.rng.choice([0, 1, 2, 3, self.tokens.highest + 1])

    async def wellformed_lane(self, index: int) -> None:
        """APISIX's side, with random contents: one call at a time, sometimes a few at once."""
        lane = "wellformed"
        seed = f"{self.o.seed}:{lane}:{index}"
        gen = ProtocolGen(random.Random(seed), self.target_values)
        own: list[int] = []
        while not self.done():
            try:
                wire = await Wire.open(self.runner.sock)
            except OSError as exc:
                self.findings.add("connect_failed", lane=lane, error=repr(exc))
                await asyncio.sleep(0.1)
                continue
            calls: list[Call] = []
            try:
                for _ in range(gen.rng.randint(20, 2000)):
                    if self.done():
                        break
                    calls = self._wellformed_calls(gen, own)
                    await self.exchange(
                        wire, gen, calls, lane, chunked=gen.rng.random() < 0.03, garbage_rate=0.04
                    )
                    for call in calls:
                        if call.kind == "prepare" and call.token:
                            own.append(call.token)
                            del own[:-16]
                        elif (
                            call.kind in ("req", "resp")
                            and call.token in own
                            and not self.tokens.surely_valid(call.token)
                        ):
                            own.remove(call.token)
                # Nothing may be left over from the calls above: the next answer is this one's.
                sync = encode.prepare_conf("sync", [("spillway", "{}")])
                calls = [Call(FrameType.PREPARE_CONF, sync, "prepare", conf=ConfInfo(True, False, "ok"))]
                await self.exchange(wire, gen, calls, lane)
                self.closes["wellformed_by_us"] += 1
            except Closed as exc:
                self.closes["wellformed_by_runner"] += 1
                sent = b"".join(frame(c.ty, c.payload) for c in calls)
                self.findings.add("wellformed_connection_closed", sent, lane=lane, seed=seed, error=str(exc))
            except TimeoutError:
                sent = b"".join(frame(c.ty, c.payload) for c in calls)
                self.findings.add("no_answer", sent, lane=lane, seed=seed, timeout_s=self.o.answer_timeout_s)
            finally:
                wire.close()

    def _wellformed_calls(self, gen: ProtocolGen, own: list[int]) -> list[Call]:
        rng = gen.rng
        r = rng.random()
        if not own or r < 0.08:
            return [gen.prepare()]
        if r < 0.7:
            return [gen.req_call(self._token_for(gen, own))]
        if r < 0.86:
            return [gen.resp_call(self._token_for(gen, own))]
        if r < 0.88:
            payload = encode.extra_info_answer(gen.garbage() if rng.random() < 0.5 else None)
            return [Call(FrameType.EXTRA_INFO, payload, "stray-info")]
        # A few calls at once: the runner queues them behind the one in flight. Only the last may
        # ask questions: a queued call pauses reading, so answers sent behind it would not be read.
        batch: list[Call] = []
        for _ in range(rng.randint(2, 10)):
            kind = rng.random()
            if kind < 0.15:
                batch.append(gen.prepare())
            elif kind < 0.9:
                batch.append(gen.req_call(self._token_for(gen, own)))
            else:
                batch.append(Call(FrameType.EXTRA_INFO, encode.extra_info_answer(None), "stray-info"))
        if rng.random() < 0.5:
            token = self._token_for(gen, own)
            batch.append(gen.resp_call(token))
        return batch

    async def mutated_lane(self, index: int) -> None:
        """Mutated payloads or types with the framing intact, one at a time."""
        lane = "mutated"
        seed = f"{self.o.seed}:{lane}:{index}"
        gen = ProtocolGen(random.Random(seed), self.target_values)
        while not self.done():
            try:
                wire = await Wire.open(self.runner.sock)
            except OSError as exc:
                self.findings.add("connect_failed", lane=lane, error=repr(exc))
                await asyncio.sleep(0.1)
                continue
            call = Call(0, b"", "none")
            try:
                for _ in range(gen.rng.randint(20, 2000)):
                    if self.done():
                        break
                    base = self._base_frame(gen)
                    ty, payload = gen.mutate(base.ty, base.payload)
                    call = Call(ty, payload, base.kind)
                    await self.exchange(wire, gen, [call], lane, garbage_rate=0.02)
                self.closes["mutated_by_us"] += 1
            except Closed as exc:
                self.closes["mutated_by_runner"] += 1
                self.findings.add(
                    "mutated_connection_closed",
                    frame(call.ty, call.payload),
                    lane=lane,
                    seed=seed,
                    error=str(exc),
                )
            except TimeoutError:
                self.findings.add("no_answer", frame(call.ty, call.payload), lane=lane, seed=seed)
            finally:
                wire.close()

    def _base_frame(self, gen: ProtocolGen) -> Call:
        r = gen.rng.random()
        token = self._token_for(gen, self.tokens.recent[-8:])
        if r < 0.2:
            return gen.prepare()
        if r < 0.7:
            return gen.req_call(token)
        if r < 0.9:
            return gen.resp_call(token)
        if r < 0.95:
            return Call(FrameType.EXTRA_INFO, encode.extra_info_answer(gen.garbage()), "info")
        return Call(FrameType.RPC_ERROR, encode.error(gen.rng.randint(0, 3)), "error")

    def chaos_bytes(self, gen: ProtocolGen) -> tuple[bytes, int, str]:
        """(bytes, frames they hold, what kind of chaos)."""
        rng = gen.rng
        r = rng.random()
        if r < 0.15:
            return gen.garbage(rng.choice([16, 256, 4096])), 1, "random_bytes"
        if r < 0.25:
            # A flood behind a call that waits for an answer never given: past the backlog.
            token = self._token_for(gen, self.tokens.recent[-8:])
            first = gen.resp_call(token)
            rest = [gen.req_call(token) for _ in range(rng.randint(17, 40))]
            frames = [frame(c.ty, c.payload) for c in [first, *rest]]
            return b"".join(frames), len(frames), "flood"
        if r < 0.35:
            ty = rng.choice([0, 1, 2, 3, 4, rng.randint(5, 255)])
            return (
                bytes([ty])
                + rng.choice([b"\xff\xff\xff", b"\x00\x10\x00", b"\x00\x00\x09"])
                + gen.garbage(8),
                1,
                "partial",
            )
        if r < 0.45:
            count = rng.randint(1, 50)
            return b"".join(frame(rng.randint(0, 255), b"") for _ in range(count)), count, "empty_frames"
        # A stream of frames, some mutated, one with a wrong length or cut short.
        parts: list[bytearray] = []
        for _ in range(rng.randint(1, 12)):
            base = self._base_frame(gen)
            ty, payload = gen.mutate(base.ty, base.payload) if rng.random() < 0.5 else (base.ty, base.payload)
            parts.append(bytearray(frame(ty, payload)))
        victim = rng.choice(parts)
        how = rng.random()
        if how < 0.4:
            length = rng.choice(
                [
                    0,
                    1,
                    0xFFFFFF,
                    len(victim) - 4 + rng.randint(1, 64),
                    max(0, len(victim) - 4 - rng.randint(1, 8)),
                ]
            )
            victim[1:4] = min(length, 0xFFFFFF).to_bytes(3, "big")
        elif how < 0.7:
            del victim[rng.randint(1, len(victim)) :]
        else:
            victim[rng.randrange(len(victim))] = rng.getrandbits(8)
        return b"".join(parts), len(parts), "stream"

    async def chaos_lane(self, index: int) -> None:
        """Anything goes; the runner may close, but what it sends must be whole, valid frames."""
        lane = "chaos"
        seed = f"{self.o.seed}:{lane}:{index}"
        gen = ProtocolGen(random.Random(seed), self.target_values)
        while not self.done():
            data, count, kind = self.chaos_bytes(gen)
            self.stats[f"chaos:{kind}"] += 1
            try:
                reader, writer = await asyncio.open_unix_connection(str(self.runner.sock), limit=1 << 24)
            except OSError as exc:
                self.findings.add("connect_failed", lane=lane, error=repr(exc))
                await asyncio.sleep(0.1)
                continue
            self.count(lane, count)
            received = bytearray()
            closed = False
            try:
                at = 0
                while at < len(data):
                    step = len(data) if gen.rng.random() < 0.7 else gen.rng.randint(1, 512)
                    writer.write(data[at : at + step])
                    at += step
                    await writer.drain()
                if gen.rng.random() < 0.85:
                    writer.write_eof()
                async with asyncio.timeout(self.o.chaos_linger_s):
                    while chunk := await reader.read(1 << 16):
                        received += chunk
                closed = True
                self.closes["chaos_by_runner"] += 1
            except TimeoutError:
                self.closes["chaos_by_us"] += 1
            except ConnectionError:
                self.closes["chaos_reset"] += 1
            finally:
                writer.close()
            self._check_stream(bytes(received), data, closed)

    def _check_stream(self, received: bytes, sent: bytes, closed: bool) -> None:
        """Whatever the runner sends is a sequence of whole frames it could have meant."""
        at = 0
        while at + 4 <= len(received):
            ty = received[at]
            length = int.from_bytes(received[at + 1 : at + 4], "big")
            if at + 4 + length > len(received):
                break
            payload = received[at + 4 : at + 4 + length]
            at += 4 + length
            self.answers[f"chaos_frame:{ty}"] += 1
            try:
                if ty == FrameType.RPC_ERROR:
                    code = messages.err_code(payload)
                    self.errors[
                        ErrCode(code).name if code in ErrCode._value2member_map_ else f"code-{code}"
                    ] += 1
                elif ty == FrameType.PREPARE_CONF:
                    self.tokens.issued(messages.conf_token(payload), None)
                elif ty == FrameType.HTTP_REQ_CALL:
                    _, action = messages.req_call_answer(payload)
                    if isinstance(action, messages.Rewrite):
                        for k, v in action.headers:
                            if k.lower() == TARGET_HEADER and v is not None and v not in self.allowed_targets:
                                self.findings.add(
                                    "forged_target_value", sent, received, lane="chaos", value=v
                                )
                elif ty == FrameType.HTTP_RESP_CALL:
                    messages.resp_call_answer(payload)
                elif ty == FrameType.EXTRA_INFO:
                    messages.extra_info_request(payload)
                else:
                    self.findings.add("unknown_frame_type_sent", sent, received, lane="chaos", type=ty)
            except messages.DecodeError as exc:
                self.findings.add("undecodable_answer", sent, received, lane="chaos", type=ty, error=str(exc))
        if closed and at != len(received):
            self.findings.add(
                "partial_frame_before_close", sent, received, lane="chaos", left=len(received) - at
            )

    async def probe(self, label: str = "public") -> None:
        """A known-good PrepareConf and HTTPReqCall on a new connection."""
        gen = ProtocolGen(random.Random(f"{self.o.seed}:probe:{self.probes.total()}"), self.target_values)
        calls: list[Call] = []
        try:
            wire = await Wire.open(self.runner.sock)
        except OSError as exc:
            self.probes["failed"] += 1
            self.findings.add("probe_failed", lane="probe", error=repr(exc))
            return
        try:
            async with asyncio.timeout(self.o.answer_timeout_s):
                prepare = Call(
                    FrameType.PREPARE_CONF,
                    encode.prepare_conf("probe", [("spillway", "{}")]),
                    "prepare",
                    conf=ConfInfo(True, False, "ok"),
                )
                calls = [prepare]
                wire.writer.write(frame(prepare.ty, prepare.payload))
                ty, payload = await wire.frame()
                if ty != FrameType.PREPARE_CONF:
                    raise Closed(f"PrepareConf answered with frame type {ty}")
                token = messages.conf_token(payload)
                self.tokens.issued(token, prepare.conf)
                for classification in ("public", "confidential"):
                    headers: list[tuple[str, str | None]] = [
                        (CLASSIFICATION, classification),
                        ("x-fuzz-route", "cloud"),
                    ]
                    request = GenRequest(
                        "/v2/models/m0/infer", headers, [], 2, bytes([127, 0, 0, 1]), may_leave(headers)
                    )
                    call = gen.req_call(token, request)
                    calls = [call]
                    wire.writer.write(frame(call.ty, call.payload))
                    ty, payload = await wire.frame()
                    if ty != FrameType.HTTP_REQ_CALL:
                        raise Closed(f"HTTPReqCall answered with frame type {ty}")
                    answer_id, action = messages.req_call_answer(payload)
                    if answer_id != call.call_id:
                        raise Closed(f"answer id {answer_id} for call {call.call_id}")
                    self._check_req(
                        "wellformed", call, answer_id, action, sent=call.payload, received=payload
                    )
            self.probes["ok"] += 1
        except (Closed, TimeoutError, messages.DecodeError) as exc:
            self.probes["failed"] += 1
            sent = b"".join(frame(c.ty, c.payload) for c in calls)
            self.findings.add("probe_failed", sent, lane="probe", error=repr(exc))
        finally:
            wire.close()

    async def watch(self, progress: Progress) -> None:
        """Liveness, RSS and probes while the lanes run."""
        next_probe = 0
        pid = self.runner.proc.pid
        while not self.done():
            code = self.runner.proc.poll()
            if code is not None:
                self.findings.add("runner_died", exit_code=code)
                self.aborted = True
                return
            self.rss.sample(pid)
            self.rss.track(self.sent, self.o.frames, conf_tokens=self.tokens.highest)
            if self.sent >= next_probe:
                next_probe = self.sent + self.o.probe_every
                await self.probe()
            progress.show(
                self.sent,
                self.o.frames,
                f"frames | rss {self.rss.end_kib / 1024:.0f} MiB | violations {self.findings.total}",
            )
            await asyncio.sleep(0.25)

    async def run(self) -> None:
        progress = Progress(self.o.progress, "frames")
        self.rss.sample(self.runner.proc.pid)
        lanes = [self.wellformed_lane(i) for i in range(self.o.wellformed_lanes)]
        lanes += [self.mutated_lane(i) for i in range(self.o.mutated_lanes)]
        lanes += [self.chaos_lane(i) for i in range(self.o.chaos_lanes)]
        await asyncio.gather(self.watch(progress), *lanes)
        progress.show(self.sent, self.o.frames, f"frames | violations {self.findings.total}")
        progress.close()
        if not self.aborted:
            await self.probe()
            self.rss.sample(self.runner.proc.pid)
            self.rss.track(self.sent, self.o.frames, conf_tokens=self.tokens.highest)
            if self.rss.growth_mib > self.o.max_rss_growth_mib:
                self.findings.add("rss_growth", **self.rss.summary(), limit_mib=self.o.max_rss_growth_mib)


def run_runner_campaign(options: RunnerOptions) -> dict[str, Any]:
    """Start a runner, fuzz it, stop it; the summary, with every violation found."""
    workdir_cm = (
        contextlib.nullcontext(options.workdir)
        if options.workdir is not None
        else tempfile.TemporaryDirectory(prefix="spillway-fuzz-")
    )
    with workdir_cm as raw_dir:
        workdir = Path(raw_dir)
        workdir.mkdir(parents=True, exist_ok=True)
        loop = _new_loop()
        feed = MetricsFeed()
        try:
            metrics_url = loop.run_until_complete(feed.start()) if options.metrics_feed else None
            runner = start_runner(workdir, runner_config(metrics_url), options.seed)
            campaign = RunnerCampaign(options, runner)
            try:
                loop.run_until_complete(campaign.run())
            finally:
                elapsed = time.monotonic() - campaign.started
                cpu = {"runner": cpu_s(runner.proc.pid), "fuzzer": round(own_cpu_s() - campaign.cpu_start, 1)}
                exit_code = _stop(runner.proc)
            loop.run_until_complete(feed.aclose())
        finally:
            _close_loop(loop)
        log = _log_summary(runner.log)
    if exit_code not in (0, None) and not campaign.aborted:
        campaign.findings.add("runner_exit_code", exit_code=exit_code)
    if log["unhandled"]:
        campaign.findings.add("runner_unhandled_exception", lines=log["unhandled"])
    return {
        "campaign": "runner",
        "seed": options.seed,
        "frames_target": options.frames,
        "frames_sent": campaign.sent,
        "frames_by_lane": dict(campaign.lane_frames),
        "elapsed_s": round(elapsed, 1),
        "frames_per_s": round(campaign.sent / max(elapsed, 1e-6)),
        "cpu_s": cpu,
        "answers": sum(
            v
            for k, v in campaign.answers.items()
            if k != "extra_info_question" and not k.startswith("chaos_frame")
        ),
        "answers_by_kind": dict(sorted(campaign.answers.items())),
        "errors_by_kind": dict(campaign.errors),
        "decisions": dict(campaign.decisions),
        "closes": dict(campaign.closes),
        "probes": dict(campaign.probes),
        "stats": dict(sorted(campaign.stats.items())),
        "metrics_feed_scrapes": feed.scrapes,
        "rss_kib": campaign.rss.summary(),
        "runner": {"pid": runner.proc.pid, "exit_code": exit_code, "log": log},
        "violations": campaign.findings.summary(),
    }


def _stop(proc: subprocess.Popen[bytes]) -> int | None:
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return None


# HTTP: what the generator builds


@dataclass
class HttpReq:
    """One request of a script and what the server may do with it."""

    raw: bytes
    note: str
    seq: int | None = None  # echoed by the handler when it answers
    accept: bool = True  # the handler may answer it
    must_accept: bool = True  # ... and must, unless an earlier request ended the connection
    rejects: frozenset[int] = frozenset()  # statuses the server may refuse it with, then close
    closes: bool | None = False  # an answer ends the connection (None: either way)
    head: bool = False
    expect_continue: bool = False
    body_digest: str | None = None
    forbidden: tuple[int, ...] = ()  # sequence numbers smuggled inside it: never answered
    skippable: bool = False  # the server may pass over it without a word (empty lines)


@dataclass
class HttpScript:
    requests: list[HttpReq]
    pieces: list[tuple[bytes, float]]  # bytes to send, then a pause
    note: str


@dataclass
class HttpOptions:
    requests: int = 100_000
    seed: int = 1
    target: str = "echo"
    lanes: int = 48
    head: bool = True
    pipelined_expect: bool = True
    storm_every: int = 400  # scripts between connection storms
    progress: bool = True
    artifacts: Path | None = None
    workdir: Path | None = None
    model_repository: Path = EXAMPLE_REPOSITORY
    max_rss_growth_mib: float = 128.0
    answer_timeout_s: float = 60.0


FUZZ_LIMITS = HttpLimits(
    max_header_bytes=16 * 1024,
    max_headers=64,
    header_timeout_s=1.0,
    idle_timeout_s=2.0,
    body_timeout_s=1.0,
    max_connections=96,
    max_pipelined=8,
)
FUZZ_MAX_BODY = 64 * 1024
TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
PATH_CHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/"
ODD_METHODS = [
    "get",
    "Get",
    "PURGE",
    "MKCALENDAR",
    "QUERY",
    "SEARCH",
    "LINK",
    "SOURCE",
    "PRI",
    "FOO",
    "G ET",
    "GET\x00",
    "\x16\x03\x01",
]
ADD_SUB_BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]},
        ]
    }
).encode()


def _after_seq(after: bytes) -> int | None:
    match = re.search(rb"x-fuzz-seq: (\d+)", after)
    return int(match.group(1)) if match else None


def body_digest(body: bytes) -> str:
    return f"{len(body)}:{hashlib.sha1(body).hexdigest()[:16]}"


class HttpGen:
    """Scripts of requests, each with what the server may and must do with it."""

    def __init__(self, rng: random.Random, options: HttpOptions, limits: HttpLimits, max_body: int) -> None:
        self.rng = rng
        self.o = options
        self.limits = limits
        self.max_body = max_body
        self.seq = rng.randrange(1 << 20) * 1000

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def target(self, seq: int) -> str:
        rng = self.rng
        if self.o.target == "function":
            return rng.choice(
                [
                    "/v2/health/ready",
                    "/v2/health/live",
                    "/v2/models/add_sub",
                    "/v2/models/add_sub/ready",
                    "/v2",
                    "/v2/repository/index",
                    "/v2/models/add_sub/stats",
                    "/metrics",
                    "/nope",
                    "//v2/./health/ready",
                    "/v2/models/%61dd_sub",
                    "/v2/models/add_sub/infer?x=1",
                ]
            )
        path = "".join(rng.choice(PATH_CHARS) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.2:
            path += "".join(f"%{rng.getrandbits(8):02X}" for _ in range(rng.randint(1, 6)))
        query = ""
        if rng.random() < 0.3:
            query = "?" + "&".join(
                f"{rng.choice(TOKEN)}={rng.choice(PATH_CHARS)}" for _ in range(rng.randint(1, 4))
            )
        return f"/fz/{seq}/{path}{query}"

    def extra_headers(self, n: int) -> list[tuple[str, str]]:
        rng = self.rng
        out = []
        for i in range(n):
            name = "x-" + "".join(rng.choice(TOKEN) for _ in range(rng.randint(1, 20))) + f"-{i}"
            value = "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(0, 40))).strip()
            out.append((name, value))
        if rng.random() < 0.2 and out:  # duplicates of an ordinary header
            out.extend([out[0]] * rng.randint(1, 3))
        return out

    def build(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes = b"",
        framing: str = "length",
        version: str = "HTTP/1.1",
        chunks: list[bytes] | None = None,
    ) -> bytes:
        lines = [f"{method} {target} {version}".encode("latin-1")]
        lines += [f"{k}: {v}".encode("latin-1") for k, v in headers]
        if framing == "length" and (body or method in ("POST", "PUT", "PATCH")):
            lines.append(b"content-length: %d" % len(body))
        if framing == "chunked":
            lines.append(b"transfer-encoding: chunked")
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        if framing != "chunked":
            return head + body
        return head + self.chunked(body if chunks is None else b"", chunks)

    def chunked(self, body: bytes, chunks: list[bytes] | None = None) -> bytes:
        rng = self.rng
        if chunks is None:
            chunks = []
            at = 0
            while at < len(body):
                step = rng.randint(1, max(1, len(body) - at))
                chunks.append(body[at : at + step])
                at += step
        out = bytearray()
        for chunk in chunks:
            size = f"{len(chunk):x}" if rng.random() < 0.7 else f"{len(chunk):X}"
            if rng.random() < 0.1:
                size = "0" * rng.randint(1, 4) + size
            ext = ";" + rng.choice(["a=b", "x", 'q="1"']) if rng.random() < 0.1 else ""
            out += f"{size}{ext}\r\n".encode() + chunk + b"\r\n"
        out += b"0\r\n"
        if rng.random() < 0.1:
            out += b"x-trailer: t\r\n"
        return bytes(out + b"\r\n")

    def body(self) -> bytes:
        rng = self.rng
        if self.o.target == "function":
            return ADD_SUB_BODY
        size = rng.choice([0, 1, 10, 100, 1000, rng.randint(0, 8000)])
        return rng.randbytes(size)

    def good(self, *, close: bool = False, expect: bool = False, slow: bool = False) -> HttpReq:
        rng = self.rng
        seq = self.next_seq()
        methods = ["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"] + (["HEAD"] if self.o.head else [])
        method = rng.choice(methods)
        if self.o.target == "function" and rng.random() < 0.5:
            method = "POST"
        target = self.target(seq)
        if self.o.target == "function" and method == "POST":
            target = "/v2/models/add_sub/infer"
        headers = [("Host", rng.choice(["x", "fn.example:9000", "localhost"])), ("x-fuzz-seq", str(seq))]
        headers += self.extra_headers(rng.choice([0, 0, 1, 3, 8]))
        if close:
            headers.append(("Connection", rng.choice(["close", "Close", "keep-alive, close"])))
        body = self.body() if method in ("POST", "PUT", "PATCH") or rng.random() < 0.1 else b""
        if method == "HEAD":
            body = b""
        if expect and body:
            headers.append(("Expect", "100-continue"))
        rng.shuffle(headers)
        framing = "chunked" if body and rng.random() < 0.3 else "length"
        version = "HTTP/1.1"
        closes: bool | None = close
        if not close and rng.random() < 0.03:
            version = "HTTP/1.0"
            keep = rng.random() < 0.5
            if keep:
                headers.append(("Connection", "keep-alive"))
            closes = None if keep else True
            framing = "length"
        raw = self.build(method, target, headers, body, framing, version)
        return HttpReq(
            raw,
            "good",
            seq,
            closes=closes,
            head=method == "HEAD",
            expect_continue=expect and bool(body),
            body_digest=body_digest(body),
            rejects=frozenset({408}) if slow else frozenset(),
        )

    def limits_case(self) -> HttpReq:
        """Requests at and past the head size, header count and body limits."""
        rng = self.rng
        seq = self.next_seq()
        base = [("Host", "x"), ("x-fuzz-seq", str(seq))]
        r = rng.random()
        if r < 0.35:
            n = self.limits.max_headers - len(base) + rng.randint(-2, 3)
            headers = base + [(f"x-n{i}", "v") for i in range(max(0, n))]
            raw = self.build("GET", self.target(seq), headers, framing="none")
            over = len(headers) > self.limits.max_headers
            return HttpReq(
                raw,
                "header_count",
                seq,
                accept=not over,
                must_accept=not over,
                rejects=frozenset({431}) if over else frozenset(),
            )
        if r < 0.7:
            size = self.limits.max_header_bytes + rng.randint(-2048, 8192)
            headers = [*base, ("x-big", "b" * max(0, size))]
            raw = self.build("GET", self.target(seq), headers, framing="none")
            small = len(raw) <= self.limits.max_header_bytes
            return HttpReq(
                raw, "head_size", seq, must_accept=small, rejects=frozenset() if small else frozenset({431})
            )
        size = self.max_body + rng.randint(-16, 4096)
        body = rng.randbytes(max(0, size))
        framing = rng.choice(["length", "chunked"])
        raw = self.build("POST", self.target(seq), base, body, framing)
        fits = len(body) <= self.max_body
        return HttpReq(
            raw,
            "body_size",
            seq,
            accept=fits,
            must_accept=fits,
            rejects=frozenset() if fits else frozenset({413}),
            body_digest=body_digest(body),
        )

    def odd(self) -> tuple[HttpReq, bytes]:
        """A request the server may take or refuse with a 4xx; (request, bytes after it)."""
        rng = self.rng
        seq = self.next_seq()
        host = [("Host", "x"), ("x-fuzz-seq", str(seq))]
        target = self.target(seq)
        r = rng.random()
        if r < 0.12:
            method = rng.choice(
                [*ODD_METHODS, "X" * rng.randint(20, 5000), "".join(rng.choice(TOKEN) for _ in range(8))]
            )
            return HttpReq(
                self.build(method, target, host, framing="none"),
                "odd_method",
                seq,
                must_accept=False,
                rejects=frozenset({400, 405, 408}),
            ), b""
        if r < 0.24:
            odd = "".join(
                chr(rng.choice([0, 1, 9, 0x0B, 0x1F, 0x7F, 0x80, 0xFF, 0x22, 0x3C, 0x23, 0x20]))
                for _ in range(rng.randint(1, 4))
            )
            where = rng.randint(0, len(target))
            target = target[:where] + odd + target[where:]
            target = rng.choice([target, "*", "http://x" + target, "", "//" + target])
            return HttpReq(
                self.build("GET", target, host, framing="none"),
                "odd_target",
                seq,
                must_accept=False,
                rejects=frozenset({400, 408}),
            ), b""
        if r < 0.4:
            bad_byte = chr(rng.choice([0, 1, 0x0B, 0x0C, 0x7F, 0x80, 0xFF, 0x20, 0x3A, 0x09]))
            name = rng.choice(["x-a" + bad_byte, bad_byte + "x", "x a", "", "x-\u00e9"])
            value = rng.choice(["v" + bad_byte + "v", bad_byte, "\x00", "a\rb", "\u00e9\u00ff"])
            headers = [*host, (name, "v")] if rng.random() < 0.5 else [*host, ("x-v", value)]
            raw = self.build("GET", target, headers, framing="none")
            if rng.random() < 0.3:  # obs-fold, bare LF
                raw = raw.replace(
                    b"\r\nx-fuzz-seq", rng.choice([b"\r\n x-fold: 1\r\nx-fuzz-seq", b"\nx-fuzz-seq"]), 1
                )
            return HttpReq(raw, "odd_header", seq, must_accept=False, rejects=frozenset({400, 408})), b""
        if r < 0.5:
            headers = [
                *host,
                ("Upgrade", rng.choice(["websocket", "h2c", "TLS/1.2"])),
                ("Connection", rng.choice(["Upgrade", "upgrade", "keep-alive"])),
            ]
            closes = None if headers[-1][1] == "keep-alive" else True
            raw = self.build("GET", target, headers, framing="none")
            return HttpReq(raw, "upgrade", seq, closes=closes), b"\x00\x01garbage after the upgrade\r\n\r\n"
        if r < 0.58:
            raw = self.build(
                "CONNECT", rng.choice(["example.com:443", "x:1", "/", "[::1]:80"]), host, framing="none"
            )
            return HttpReq(
                raw, "connect", seq, accept=False, must_accept=False, rejects=frozenset({405, 400})
            ), b"\x16\x03\x01 tunnel bytes"
        if r < 0.8:
            return self.smuggle(seq, host, target)
        if r < 0.92:
            return self.bad_chunks(seq, host, target), b""
        raw = self.build(
            "GET",
            target,
            [*host, ("Content-Length", "5"), ("Content-Length", rng.choice(["5", "6", "05"]))],
            b"abcde",
            framing="none",
        )
        return HttpReq(raw, "duplicate_length", seq, must_accept=False, rejects=frozenset({400})), b""

    def smuggle(self, seq: int, host: list[tuple[str, str]], target: str) -> tuple[HttpReq, bytes]:
        """Content-Length and Transfer-Encoding disagreeing, with a request hidden behind one of them."""
        rng = self.rng
        inner_seq = self.next_seq()
        inner = f"GET /smuggled/{inner_seq} HTTP/1.1\r\nHost: x\r\nx-fuzz-seq: {inner_seq}\r\n\r\n".encode()
        te = rng.choice(
            [
                "chunked",
                "Chunked",
                " chunked",
                "chunked ",
                "identity, chunked",
                "chunked, identity",
                "gzip",
                "xchunked",
                "chunked\x0b",
                "chunked;q=1",
            ]
        )
        r = rng.random()
        if r < 0.5:  # CL.TE: the length covers the inner request, the chunks end before it
            body = b"0\r\n\r\n" + inner
            headers = [*host, ("Content-Length", str(len(body))), ("Transfer-Encoding", te)]
        elif r < 0.8:  # TE.CL: the chunk holds the inner request, the length ends before it
            chunk = inner
            body = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n"
            headers = [*host, ("Content-Length", "4"), ("Transfer-Encoding", te)]
        else:
            # Two Transfer-Encoding headers and no length: valid when chunked comes last, and then
            # what follows the last chunk is simply the next request.
            body = b"0\r\n\r\n"
            headers = [
                *host,
                ("Transfer-Encoding", te),
                ("Transfer-Encoding", rng.choice(["chunked", "identity"])),
            ]
            raw = self.build("POST", target, headers, framing="none") + body
            return HttpReq(
                raw, "two_codings", seq, must_accept=False, closes=None, rejects=frozenset({400, 408})
            ), inner
        rng.shuffle(headers)
        raw = self.build("POST", target, headers, framing="none") + body
        return HttpReq(
            raw,
            "smuggle",
            seq,
            must_accept=False,
            closes=True,
            rejects=frozenset({400, 408, 413}),
            forbidden=(inner_seq,),
        ), b""

    def bad_chunks(self, seq: int, host: list[tuple[str, str]], target: str) -> HttpReq:
        rng = self.rng
        bad = rng.choice(
            [
                b"zz\r\nabc\r\n0\r\n\r\n",
                b"-1\r\nabc\r\n0\r\n\r\n",
                b"0x3\r\nabc\r\n0\r\n\r\n",
                b"ffffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
                b"5\r\nabcdefgh\r\n0\r\n\r\n",
                b"3\r\nabc0\r\n\r\n",
                b"3\nabc\n0\n\n",
                b"3 \r\nabc\r\n0\r\n\r\n",
                b"7fffffff\r\n" + b"a" * 100,
                b"\r\n\r\n",
            ]
        )
        raw = self.build("POST", target, [*host, ("Transfer-Encoding", "chunked")], framing="none") + bad
        return HttpReq(raw, "bad_chunks", seq, must_accept=False, rejects=frozenset({400, 408, 413}))

    def garbage(self) -> HttpReq:
        rng = self.rng
        if rng.random() < 0.1:  # empty lines before a request line are ignored (RFC 9112, 2.2)
            return HttpReq(
                b"\r\n" * rng.randint(1, 4), "empty_lines", None, must_accept=False, skippable=True
            )
        data = rng.choice(
            [
                rng.randbytes(rng.randint(1, 300)),
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                b"GET / HTTP/9.9\r\n\r\n",
                b"GET / FOO/1.1\r\n\r\n",
                b"GET /\r\n\r\n",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            ]
        )
        return HttpReq(
            data, "garbage", None, must_accept=False, closes=None, rejects=frozenset({400, 405, 408, 431})
        )

    def sentinel(self) -> HttpReq:
        seq = self.next_seq()
        raw = f"GET /sentinel/{seq} HTTP/1.1\r\nHost: x\r\nx-fuzz-seq: {seq}\r\nConnection: close\r\n\r\n"
        return HttpReq(raw.encode(), "sentinel", seq, closes=True, body_digest=body_digest(b""))

    def script(self) -> HttpScript:
        rng = self.rng
        requests: list[HttpReq] = []
        after = b""
        slow = rng.random() < 0.05
        shape = rng.random()
        count = rng.choice([1, 1, 2, 3, 5, 8, 12, 20])
        for i in range(count):
            r = rng.random()
            if r < 0.72 or (self.o.target == "function" and r < 0.85):
                expect = rng.random() < 0.05 and (self.o.pipelined_expect or i == 0)
                requests.append(self.good(expect=expect, slow=slow, close=rng.random() < 0.02))
            elif r < 0.82:
                requests.append(self.limits_case())
            elif r < 0.98:
                req, after = self.odd()
                requests.append(req)
                if after:
                    # What follows is refused if the server goes on reading (no upgrade, no tunnel).
                    requests.append(
                        HttpReq(
                            after,
                            "after",
                            _after_seq(after),
                            accept=after.startswith(b"GET /smuggled/"),
                            must_accept=False,
                            closes=None,
                            rejects=frozenset({400, 408}),
                        )
                    )
                    break
            else:
                requests.append(self.garbage())
                if not requests[-1].skippable:
                    break
        note = "pipelined"
        if shape < 0.1 and not after:
            # The last request cut short: the server must time it out with 408.
            cut = self.good()
            keep = rng.randint(1, len(cut.raw) - 1)
            requests.append(
                HttpReq(
                    cut.raw[:keep],
                    "truncated",
                    cut.seq,
                    accept=False,
                    must_accept=False,
                    closes=None,
                    rejects=frozenset({408}),
                )
            )
            note = "truncated"
        elif not after:
            requests.append(self.sentinel())
        if slow:
            for req in requests:
                req.rejects |= {408}
        data = b"".join(r.raw for r in requests)
        pieces: list[tuple[bytes, float]] = []
        if slow:
            note += "+slow"
            at = 0
            while at < len(data):
                step = rng.randint(1, 64)
                pieces.append((data[at : at + step], rng.choice([0.0, 0.001, 0.005, 0.01])))
                at += step
        elif rng.random() < 0.3:
            note += "+split"
            at = 0
            while at < len(data):
                step = rng.randint(1, max(1, len(data) // 3))
                pieces.append((data[at : at + step], 0.0))
                at += step
        else:
            pieces = [(data, 0.0)]
        return HttpScript(requests, pieces, note)


# HTTP: answers


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class AnswerStream:
    """Parses a server's answers; the caller says which request each next answer is for."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.eof = False

    def feed(self, data: bytes) -> None:
        self.buf += data

    def next(self, head_request: bool) -> tuple[Answer | None, str | None]:
        """(answer, problem): None, None when more bytes are needed."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if self.eof and self.buf:
                return None, "truncated_answer"
            if len(self.buf) > 1 << 20:
                return None, "answer_head_too_long"
            return None, None
        head = bytes(self.buf[:end]).decode("latin-1")
        lines = head.split("\r\n")
        match = re.fullmatch(r"HTTP/1\.1 (\d{3}) .*", lines[0])
        if not match:
            return None, "malformed_status_line"
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                return None, "malformed_answer_header"
            headers[name.strip().lower()] = value.strip()
        status = int(match.group(1))
        if 100 <= status < 200:
            del self.buf[: end + 4]
            return Answer(status, headers, b""), None
        length = int(headers.get("content-length", "0"))
        if head_request:
            rest = bytes(self.buf[end + 4 : end + 4 + 5])
            if length and not rest and not self.eof:
                return None, None
            if length and rest and b"HTTP/1.1 "[: len(rest)] != rest:
                # A body after an answer to HEAD: report it, skip it, and read on.
                if len(self.buf) < end + 4 + length and not self.eof:
                    return None, None
                del self.buf[: end + 4 + length]
                return Answer(status, headers, b""), "head_answer_has_body"
            del self.buf[: end + 4]
            return Answer(status, headers, b""), None
        if len(self.buf) < end + 4 + length:
            if self.eof:
                return None, "truncated_answer"
            return None, None
        body = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        return Answer(status, headers, body), None


async def echo_handler(request: Request) -> Response:
    """Says which request it answers and what body it saw."""
    seq = request.headers.get("x-fuzz-seq", "")
    if seq.endswith("7"):
        await asyncio.sleep(0)
    headers = [("x-fuzz-seq", seq), ("x-fuzz-body", body_digest(bytes(request.body))), ("x-fuzz-echo", "1")]
    return Response(200, headers, f"{request.method} {request.target}".encode("latin-1", "replace")[:4096])


def serve_echo(limits: HttpLimits, max_body: int) -> None:
    """The child process of the echo campaign: print the port, serve until SIGTERM."""
    from functions import http_server

    async def main() -> None:
        server = await http_server.serve(echo_handler, "127.0.0.1", 0, max_body, limits)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.close()

    loop = _new_loop()
    try:
        loop.run_until_complete(main())
    finally:
        _close_loop(loop)


@dataclass
class HttpServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path


def start_http_server(workdir: Path, options: HttpOptions) -> HttpServerProcess:
    log = workdir / "http-server.log"
    limits = FUZZ_LIMITS
    if options.target == "echo":
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "http-serve",
            "--limits",
            json.dumps(asdict(limits)),
            "--max-body",
            str(FUZZ_MAX_BODY),
        ]
        env = dict(os.environ)
    else:
        port = _free_port()
        cmd = serve_command(port, options.model_repository)
        env = {
            **os.environ,
            "SPILLWAY_MAX_HEADER_BYTES": str(limits.max_header_bytes),
            "SPILLWAY_MAX_HEADERS": str(limits.max_headers),
            "SPILLWAY_HEADER_TIMEOUT_S": str(limits.header_timeout_s),
            "SPILLWAY_IDLE_TIMEOUT_S": str(limits.idle_timeout_s),
            "SPILLWAY_BODY_TIMEOUT_S": str(limits.body_timeout_s),
            "SPILLWAY_MAX_CONNECTIONS": str(limits.max_connections),
            "SPILLWAY_MAX_BODY_BYTES": str(FUZZ_MAX_BODY),
        }
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err)
    if options.target == "echo":
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("PORT "):
            proc.kill()
            raise RuntimeError(f"the echo server did not start: {log.read_text()[-2000:]}")
        return HttpServerProcess(proc, int(line.split()[1]), log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the function exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if conn.recv(64).startswith(b"HTTP/1.1 200"):
                return HttpServerProcess(proc, port, log)
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the function did not get ready: {log.read_text()[-2000:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class HttpClient:
    """One client connection on a plain non-blocking socket. A failed write only ends the sending:
    what the server sent is still read (a transport would drop it with the write's error), so an
    answer counts as given when its bytes arrived."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.write_failed = False
        self.reset = False

    @classmethod
    async def open(cls, port: int) -> HttpClient:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        except OSError:
            sock.close()
            raise
        return cls(sock)

    async def write(self, data: bytes) -> bool:
        """False once the server no longer takes bytes."""
        try:
            await self.loop.sock_sendall(self.sock, data)
        except OSError:
            self.write_failed = True
            return False
        return True

    async def read(self) -> bytes:
        """What arrived; b"" once the connection has ended (closed or reset)."""
        try:
            return await self.loop.sock_recv(self.sock, 1 << 16)
        except OSError:
            self.reset = True
            return b""

    def close(self) -> None:
        self.sock.close()


class HttpCampaign:
    def __init__(self, options: HttpOptions, server: HttpServerProcess) -> None:
        self.o = options
        self.server = server
        self.findings = Findings(options.artifacts)
        self.rss = Rss()
        self.sent = 0
        self.complete = 0
        self.scripts = 0
        self.answers: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.notes: Counter[str] = Counter()
        self.closes: Counter[str] = Counter()
        self.aborted = False
        self.started = time.monotonic()
        self.cpu_start = own_cpu_s()
        self.echo = options.target == "echo"

    def done(self) -> bool:
        return self.sent >= self.o.requests or self.aborted

    async def lane(self, index: int) -> None:
        seed = f"{self.o.seed}:http:{index}"
        gen = HttpGen(random.Random(seed), self.o, FUZZ_LIMITS, FUZZ_MAX_BODY)
        number = 0
        while not self.done():
            script = gen.script()
            number += 1
            self.scripts += 1
            if self.o.storm_every and self.scripts % self.o.storm_every == 0:
                await self.storm(gen)
            await self.run_script(script, f"{seed}#{number}")

    async def storm(self, gen: HttpGen) -> None:
        """More connections at once than the server takes: each is served or refused with 503."""
        count = FUZZ_LIMITS.max_connections + 16
        scripts = [HttpScript([gen.sentinel()], [], "storm") for _ in range(count)]
        for script in scripts:
            script.pieces = [(script.requests[0].raw, 0.0)]
        await asyncio.gather(*(self.run_script(s, "storm", hold=0.05) for s in scripts))

    async def run_script(self, script: HttpScript, where: str, hold: float = 0.0) -> ScriptCheck:
        """One connection: send the script's pieces while reading and checking every answer."""
        for req in script.requests:
            self.notes[req.note] += 1
        sent = b"".join(p for p, _ in script.pieces)
        check = ScriptCheck(self, script, where, sent)
        try:
            conn = await HttpClient.open(self.server.port)
        except OSError as exc:
            self.findings.add("connect_failed", error=repr(exc), where=where)
            return check
        if hold:
            await asyncio.sleep(hold)

        async def send() -> None:
            for piece, pause in script.pieces:
                if not await conn.write(piece):
                    return
                if pause:
                    await asyncio.sleep(pause)

        sender = asyncio.ensure_future(send())
        self.sent += sum(1 for r in script.requests if r.note != "after")
        self.complete += sum(1 for r in script.requests if r.note not in ("truncated", "after"))
        stream = AnswerStream()
        try:
            async with asyncio.timeout(self.o.answer_timeout_s):
                while True:
                    data = await conn.read()
                    if not data:
                        stream.eof = True
                        check.reset = conn.reset
                    check.received += data
                    stream.feed(data)
                    while True:
                        answer, problem = stream.next(check.current_is_head())
                        if problem is not None:
                            check.problem(problem, bytes(stream.buf[:512]))
                            if answer is None:
                                stream.buf.clear()
                                break
                        if answer is None:
                            break
                        check.answer(answer)
                    if stream.eof:
                        break
            check.closed()
        except TimeoutError:
            self.findings.add(
                "connection_not_closed",
                sent,
                bytes(check.received),
                where=where,
                note=script.note,
                answered=check.index,
                requests=len(script.requests),
            )
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            conn.close()
            if conn.write_failed:
                self.closes["server_closed_while_client_sent"] += 1
        return check

    async def watch(self, progress: Progress) -> None:
        pid = self.server.proc.pid
        while not self.done():
            code = self.server.proc.poll()
            if code is not None:
                self.findings.add("server_died", exit_code=code)
                self.aborted = True
                return
            self.rss.sample(pid)
            self.rss.track(self.sent, self.o.requests)
            progress.show(
                self.sent,
                self.o.requests,
                f"requests | rss {self.rss.end_kib / 1024:.0f} MiB | violations {self.findings.total}",
            )
            await asyncio.sleep(0.25)

    async def run(self) -> None:
        progress = Progress(self.o.progress, "requests")
        self.rss.sample(self.server.proc.pid)
        await asyncio.gather(self.watch(progress), *(self.lane(i) for i in range(self.o.lanes)))
        progress.show(self.sent, self.o.requests, f"requests | violations {self.findings.total}")
        progress.close()
        self.rss.sample(self.server.proc.pid)
        self.rss.track(self.sent, self.o.requests)
        if self.rss.growth_mib > self.o.max_rss_growth_mib:
            self.findings.add("rss_growth", **self.rss.summary(), limit_mib=self.o.max_rss_growth_mib)


class ScriptCheck:
    """Matches one connection's answers to its requests, in order."""

    def __init__(self, campaign: HttpCampaign, script: HttpScript, where: str, sent: bytes) -> None:
        self.c = campaign
        self.script = script
        self.requests = script.requests
        self.where = where
        self.sent = sent
        self.index = 0  # the next request to be answered
        self.ended: str | None = None  # why no more answers may come
        self.answers = 0
        self.reset = False
        self.seqs = {r.seq: i for i, r in enumerate(self.requests) if r.seq is not None}
        self.forbidden = {s for r in self.requests for s in r.forbidden}
        self.last_closes: bool | None = False
        self.received = bytearray()

    def violation(self, kind: str, **detail: Any) -> None:
        self.c.findings.add(
            kind,
            self.sent,
            bytes(self.received),
            where=self.where,
            note=self.script.note,
            index=self.index,
            requests=[r.note for r in self.requests],
            **detail,
        )

    def current(self) -> HttpReq | None:
        return self.requests[self.index] if self.index < len(self.requests) else None

    def skip_skippable(self) -> None:
        while self.index < len(self.requests) and self.requests[self.index].skippable:
            self.index += 1

    def current_is_head(self) -> bool:
        """Whether the next answer is to a HEAD request (so carries no body): skippable entries
        (blank lines between requests) are never answered."""
        at = self.index
        while at < len(self.requests) and self.requests[at].skippable:
            at += 1
        return at < len(self.requests) and self.requests[at].head

    def problem(self, kind: str, received: bytes) -> None:
        self.c.findings.add(
            kind, self.sent, received, where=self.where, note=self.script.note, index=self.index
        )

    def answer(self, answer: Answer) -> None:
        c = self.c
        status = answer.status
        if 100 <= status < 200:
            c.answers["interim"] += 1
            self.skip_skippable()
            req = self.current()
            if status != 100 or req is None or not req.expect_continue:
                self.violation(
                    "interim_answer_out_of_order", status=status, current=None if req is None else req.note
                )
            return
        self.answers += 1
        c.statuses[status] += 1
        if self.ended is not None:
            self.violation("answer_after_close", status=status, ended=self.ended)
            return
        if status >= 500 and not (status == 503 and (self.answers == 1 or not c.echo)):
            self.violation("server_error", status=status, body=answer.body[:300].decode("latin-1"))
        if c.echo:
            self._echo_answer(answer)
        else:
            self._counted_answer(answer)

    def _echo_answer(self, answer: Answer) -> None:
        c = self.c
        status = answer.status
        if answer.headers.get("x-fuzz-echo") == "1":
            c.answers["handler"] += 1
            raw_seq = answer.headers.get("x-fuzz-seq", "")
            seq = int(raw_seq) if raw_seq.isdigit() else None
            if seq in self.forbidden:
                self.violation("smuggled_request_answered", seq=seq)
                self.ended = "smuggled"
                return
            if seq is None:
                self.skip_skippable()
            at = self.seqs.get(seq) if seq is not None else self.index
            if at is None or at >= len(self.requests):
                self.violation("answer_for_unknown_request", seq=raw_seq)
                return
            if at > self.index and all(r.skippable for r in self.requests[self.index : at]):
                self.index = at
            if at != self.index:
                self.violation(
                    "answer_out_of_order",
                    seq=seq,
                    expected=self.requests[self.index].seq if self.index < len(self.requests) else None,
                )
                self.index = max(self.index, at)
            accepted = self.requests[at]
            if not accepted.accept:
                self.violation("refusable_request_accepted", request=accepted.note, status=status)
            if accepted.body_digest is not None and answer.headers.get("x-fuzz-body") != accepted.body_digest:
                self.violation(
                    "body_mismatch",
                    request=accepted.note,
                    want=accepted.body_digest,
                    got=answer.headers.get("x-fuzz-body"),
                )
            self.index = at + 1
            self.last_closes = accepted.closes
            if accepted.closes:
                self.ended = f"{accepted.note} closes"
            return
        c.answers["refusal"] += 1
        if status == 503 and self.answers == 1:
            c.closes["refused_at_cap"] += 1
            self.ended = "connection cap"
            return
        self.skip_skippable()
        req = self.current()
        if req is None:
            self.violation("refusal_without_request", status=status)
        elif status not in req.rejects:
            self.violation(
                "unexpected_refusal",
                status=status,
                request=req.note,
                body=answer.body[:200].decode("latin-1"),
            )
        self.ended = f"refused {status}"

    def _counted_answer(self, answer: Answer) -> None:
        """Against the real function: answers are not labelled, so they are counted in order."""
        closing = answer.headers.get("connection", "").lower() == "close"
        self.skip_skippable()
        req = self.current()
        if req is None:
            self.violation("answer_for_unknown_request", status=answer.status)
            return
        self.c.answers["counted"] += 1
        self.index += 1
        self.last_closes = req.closes
        if closing:
            self.ended = f"closed after {answer.status}"
            if (
                not req.closes
                and req.must_accept
                and answer.status not in req.rejects
                and answer.status != 503
            ):
                self.violation(
                    "unexpected_refusal",
                    status=answer.status,
                    request=req.note,
                    body=answer.body[:200].decode("latin-1"),
                )

    def closed(self) -> None:
        """EOF: every request that had to be answered was, unless something ended the connection."""
        c = self.c
        c.closes["reset" if self.reset else "eof"] += 1
        if self.ended is not None or self.last_closes is None:
            return
        missing = [r.note for r in self.requests[self.index :] if r.must_accept]
        if missing:
            if self.reset and self.answers == 0:
                c.closes["reset_before_any_answer"] += 1
                return
            self.violation("request_not_answered", missing=missing, answered=self.index, reset=self.reset)


def run_http_campaign(options: HttpOptions) -> dict[str, Any]:
    workdir_cm = (
        contextlib.nullcontext(options.workdir)
        if options.workdir is not None
        else tempfile.TemporaryDirectory(prefix="spillway-fuzz-http-")
    )
    with workdir_cm as raw_dir:
        workdir = Path(raw_dir)
        workdir.mkdir(parents=True, exist_ok=True)
        server = start_http_server(workdir, options)
        campaign = HttpCampaign(options, server)
        loop = _new_loop()
        try:
            loop.run_until_complete(campaign.run())
        finally:
            elapsed = time.monotonic() - campaign.started
            cpu = {"server": cpu_s(server.proc.pid), "fuzzer": round(own_cpu_s() - campaign.cpu_start, 1)}
            exit_code = _stop_tree(server.proc)
            _close_loop(loop)
        log = _log_summary(server.log)
    if exit_code not in (0, None) and not campaign.aborted:
        campaign.findings.add("server_exit_code", exit_code=exit_code)
    if log["unhandled"]:
        campaign.findings.add("server_unhandled_exception", lines=log["unhandled"])
    if options.target == "echo" and log["tracebacks"]:
        campaign.findings.add("server_logged_traceback", count=log["tracebacks"], first=log["first_errors"])
    return {
        "campaign": "http",
        "target": options.target,
        "seed": options.seed,
        "requests_target": options.requests,
        "requests_sent": campaign.sent,
        "complete_requests_sent": campaign.complete,
        "scripts": campaign.scripts,
        "elapsed_s": round(elapsed, 1),
        "requests_per_s": round(campaign.sent / max(elapsed, 1e-6)),
        "cpu_s": cpu,
        "answers": dict(campaign.answers),
        "statuses": {str(k): v for k, v in sorted(campaign.statuses.items())},
        "requests_by_kind": dict(campaign.notes),
        "closes": dict(campaign.closes),
        "rss_kib": campaign.rss.summary(),
        "server": {"pid": server.proc.pid, "exit_code": exit_code, "log": log},
        "violations": campaign.findings.summary(),
    }


def _stop_tree(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM and wait (the function stops its Triton sidecar itself)."""
    code = _stop(proc)
    if proc.stdout is not None:
        proc.stdout.close()
    return code


def replay_http_script(options: HttpOptions, lane: int, number: int, repeat: int) -> dict[str, Any]:
    """Regenerate script ``number`` of lane ``lane`` (a violation's ``where``: seed:http:lane#number)
    and run it ``repeat`` times against a fresh echo server, with its original pacing."""
    gen = HttpGen(random.Random(f"{options.seed}:http:{lane}"), options, FUZZ_LIMITS, FUZZ_MAX_BODY)
    script = gen.script()
    for _ in range(number - 1):
        script = gen.script()
    with tempfile.TemporaryDirectory(prefix="spillway-fuzz-replay-") as raw_dir:
        server = start_http_server(Path(raw_dir), options)
        campaign = HttpCampaign(options, server)
        loop = _new_loop()
        runs = []
        try:
            for i in range(repeat):
                check = loop.run_until_complete(campaign.run_script(script, f"replay#{i + 1}"))
                runs.append(
                    {"answered": check.index, "reset": check.reset, "received": bytes(check.received)}
                )
        finally:
            _stop_tree(server.proc)
            _close_loop(loop)
    return {
        "requests": [r.note for r in script.requests],
        "pieces": len(script.pieces),
        "sent": b"".join(p for p, _ in script.pieces).decode("latin-1"),
        "runs": runs,
        "violations": campaign.findings.summary(),
    }


# Command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/fuzz.py",
        description="Fuzz the runner's ext-plugin socket protocol or the function's HTTP/1.1 server. "
        "Progress goes to stderr, a JSON summary to stdout; the exit status is 1 when any invariant was "
        "violated.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2] if __doc__ else None,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    runner = sub.add_parser("runner", help="fuzz a `python -m gateway_plugin run` over its Unix socket")
    runner.add_argument("--frames", type=int, default=1_000_000, help="frames to send (default 1,000,000)")
    runner.add_argument("--seed", type=int, default=1, help="seed of the generators (default 1)")
    runner.add_argument(
        "--wellformed-lanes", type=int, default=RunnerOptions.wellformed_lanes, help="APISIX-like connections"
    )
    runner.add_argument(
        "--mutated-lanes", type=int, default=RunnerOptions.mutated_lanes, help="connections of mutated frames"
    )
    runner.add_argument(
        "--chaos-lanes", type=int, default=RunnerOptions.chaos_lanes, help="connections of garbage streams"
    )
    runner.add_argument(
        "--probe-every", type=int, default=RunnerOptions.probe_every, help="frames between probes"
    )
    runner.add_argument(
        "--max-rss-growth-mib",
        type=float,
        default=RunnerOptions.max_rss_growth_mib,
        help="peak RSS over the start-up RSS that counts as a violation",
    )
    runner.add_argument(
        "--no-metrics-feed", action="store_true", help="no fake Triton load (signals stay missing)"
    )
    http = sub.add_parser("http", help="fuzz the function's HTTP/1.1 server")
    http.add_argument("--requests", type=int, default=100_000, help="requests to send (default 100,000)")
    http.add_argument("--seed", type=int, default=1, help="seed of the generators (default 1)")
    http.add_argument(
        "--target",
        choices=["echo", "function"],
        default="echo",
        help="echo: http_server.serve with an echo handler (default); function: the real "
        "function with Triton (python -m functions serve --platform local)",
    )
    http.add_argument(
        "--model-repository", type=Path, default=EXAMPLE_REPOSITORY, help="for --target function"
    )
    http.add_argument("--lanes", type=int, default=HttpOptions.lanes, help="concurrent connections")
    http.add_argument("--no-head", action="store_true", help="send no HEAD requests")
    http.add_argument(
        "--no-pipelined-expect",
        action="store_true",
        help="Expect: 100-continue only on a connection's first request",
    )
    http.add_argument(
        "--max-rss-growth-mib",
        type=float,
        default=HttpOptions.max_rss_growth_mib,
        help="peak RSS over the start-up RSS that counts as a violation",
    )
    for sp in (runner, http):
        sp.add_argument("--json-out", type=Path, help="also write the summary here")
        sp.add_argument("--artifacts", type=Path, help="write each kept violation's bytes here")
        sp.add_argument("--quiet", action="store_true", help="no progress line")
        sp.add_argument("--workdir", type=Path, help="keep the config, socket and the server's log here")
    replay = sub.add_parser(
        "http-replay",
        help="run one generated HTTP script again (a violation's where: SEED:http:LANE#SCRIPT)",
    )
    replay.add_argument("--seed", type=int, required=True)
    replay.add_argument("--lane", type=int, required=True)
    replay.add_argument("--script", type=int, required=True)
    replay.add_argument("--repeat", type=int, default=1)
    replay.add_argument("--no-head", action="store_true")
    replay.add_argument("--no-pipelined-expect", action="store_true")
    serve = sub.add_parser("http-serve", help="(internal) the echo server the http campaign starts")
    serve.add_argument("--limits", required=True)
    serve.add_argument("--max-body", type=int, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "http-serve":
        serve_echo(HttpLimits(**json.loads(args.limits)), args.max_body)
        return 0
    summary: dict[str, Any]
    if args.command == "http-replay":
        options = HttpOptions(
            seed=args.seed,
            head=not args.no_head,
            pipelined_expect=not args.no_pipelined_expect,
            progress=False,
        )
        summary = replay_http_script(options, args.lane, args.script, args.repeat)
        print(json.dumps(summary, indent=2, default=str))
        return 1 if summary["violations"]["count"] else 0
    if args.command == "runner":
        summary = run_runner_campaign(
            RunnerOptions(
                frames=args.frames,
                seed=args.seed,
                wellformed_lanes=args.wellformed_lanes,
                mutated_lanes=args.mutated_lanes,
                chaos_lanes=args.chaos_lanes,
                probe_every=args.probe_every,
                max_rss_growth_mib=args.max_rss_growth_mib,
                metrics_feed=not args.no_metrics_feed,
                progress=not args.quiet,
                artifacts=args.artifacts,
                workdir=args.workdir,
            )
        )
    else:
        summary = run_http_campaign(
            HttpOptions(
                requests=args.requests,
                seed=args.seed,
                target=args.target,
                lanes=args.lanes,
                head=not args.no_head,
                pipelined_expect=not args.no_pipelined_expect,
                progress=not args.quiet,
                artifacts=args.artifacts,
                model_repository=args.model_repository,
                max_rss_growth_mib=args.max_rss_growth_mib,
                workdir=args.workdir,
            )
        )
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(text + "\n")
    return 1 if summary["violations"]["count"] else 0


def iter_violations(summary: dict[str, Any]) -> Iterator[str]:
    """One line per violation kind, for test failure messages."""
    for example in summary["violations"]["examples"]:
        yield json.dumps({k: v for k, v in example.items() if not k.endswith("_hex")}, default=str)[:600]


if __name__ == "__main__":
    sys.exit(main())
