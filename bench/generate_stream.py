"""LLM token streaming (Triton's ``generate_stream``, server-sent events) through Spillway's parts:
time to first token, the gap between tokens and tokens/s, each path against the one it adds to.

The chain ``tests/integration/test_apisix_generate.py`` starts, on 127.0.0.1: a tritonserver as
the on-prem cluster, the FC function server with its own sidecar, and APISIX 3.18 (a private copy
of the install, so no other APISIX collides) with both routes, a rule spilling requests marked
``x-test-spill: yes`` to the function. The model, ``tests/model_repository/tokens``, sends the
prompt's words back one event per token, ``token_delay_ms`` apart. Six paths:

    sidecar      tritonserver's own generate_stream (the on-prem baseline)
    function     the function server's URL, the body signed (the spilled baseline; APISIX signs
                 UNSIGNED-PAYLOAD)
    ext-local    APISIX, ext-plugin route, decided on-prem          (against sidecar)
    ext-spill    APISIX, ext-plugin route, spilled to the function  (against function)
    fast-local   APISIX, fast path, decided on-prem                 (against sidecar)
    fast-spill   APISIX, fast path, spilled to the function         (against function)

One stream at a time on a fresh connection; each round runs ``--streams`` of every path, stream by
stream, the order rotated between rounds, so the shared machine's drift falls on all paths alike.
Per stream: TTFT is request sent -> first event parsed; gaps are between successive events;
tokens/s is (tokens - 1) / (last event - first event). Added figures are differences of medians
against the baseline measured in the same run. A stream whose status, event count, text or
``x-spillway-decision`` is not as expected is counted by kind and left out of the timings.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import itertools
import json
import math
import os
import secrets
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import harness
from harness import ROOT, Output, add_output_options, machine_note, median, render_table, say

sys.path.insert(1, str(ROOT))  # devtools and testing are source-only: importable from the checkout
from devtools import apisix
from functions.signature import sign
from testing.apisix import FAST_HOST
from testing.http import wait_until
from testing.llm import MODEL, SPILL, running_chain

TARGET = f"/v2/models/{MODEL}/generate_stream"
PROMPT = "the quick brown fox jumps over lazy dogs"


@dataclass(frozen=True)
class Door:
    """One way into the model: where, with which headers, and what it must answer."""

    name: str
    url: str
    baseline: str | None
    host: str | None = None  # the APISIX route's Host; None: no gateway
    spill: bool = False
    expect: str | None = None  # the decision's prefix; None: no decision header at all
    key: bytes | None = None  # the function's signing key, for the direct calls

    def headers(self, body: bytes) -> dict[str, str]:
        sent = {"content-type": "application/json"}
        if self.host is not None:
            sent |= {"host": self.host, "x-data-classification": "public"}
        if self.spill:
            sent[SPILL] = "yes"
        if self.key is not None:
            sent["x-spillway-signature"] = sign(self.key, "POST", TARGET, body)
        return sent


@dataclass
class Stream:
    door: str
    round: int
    ttft_ms: float = math.nan
    gaps_ms: list[float] = field(default_factory=list)
    tokens_per_s: float = math.nan
    problem: str | None = None


def read_events(response: http.client.HTTPResponse) -> tuple[list[float], list[str | None]]:
    """Each event's arrival instant (after parsing, as a client would act on it) and its text."""
    arrivals: list[float] = []
    texts: list[str | None] = []
    data: list[bytes] = []
    while True:
        line = response.readline()
        stripped = line.rstrip(b"\r\n")
        if (not line or not stripped) and data:
            event = json.loads(b"\n".join(data))
            arrivals.append(time.perf_counter())
            texts.append(event.get("text_output") if isinstance(event, dict) else None)
            data = []
        if not line:
            return arrivals, texts
        if stripped.startswith(b"data:"):
            data.append(stripped[5:].strip())


def one_stream(door: Door, body: bytes, expected: list[str], rnd: int) -> Stream:
    """A stream on a fresh connection, opened before the clock starts (TTFT from the request)."""
    parts = urlsplit(door.url)
    headers = door.headers(body)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=20)
    out = Stream(door.name, rnd)
    try:
        conn.connect()
        sent = time.perf_counter()
        conn.request("POST", TARGET, body, headers)
        response = conn.getresponse()
        decision = response.getheader("x-spillway-decision")
        arrivals, texts = read_events(response)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        out.problem = f"error {type(exc).__name__}"
        return out
    finally:
        conn.close()
    if response.status != 200:
        out.problem = f"status {response.status}"
    elif not as_expected(decision, door.expect):
        out.problem = f"decision {decision}"
    elif len(texts) != len(expected):
        out.problem = "count"
    elif texts != expected:
        out.problem = "text"
    else:
        out.ttft_ms = (arrivals[0] - sent) * 1000
        out.gaps_ms = [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]
        span = arrivals[-1] - arrivals[0]
        out.tokens_per_s = (len(arrivals) - 1) / span if span > 0 else math.nan
    return out


def as_expected(decision: str | None, expect: str | None) -> bool:
    """No decision header straight from Triton or the function; the expected one through APISIX."""
    return not decision if expect is None else (decision or "").startswith(expect)


@contextlib.contextmanager
def chain(work: Path, cap: int) -> Iterator[dict[str, Door]]:
    """The test module's chain, with a generous cap on the function so no spill waits for a slot."""
    key = secrets.token_hex(32)
    home = apisix.node_prefix(work, 0)
    # The function's own sidecar logs to its server's log.
    with running_chain(work, key, cap, home=home, triton_log=work / "onprem-triton.log") as running:
        say(f"tritonserver, function and APISIX ({home}) ready")
        yield doors(running.triton_url, running.function_url, running.gateway_url, key.encode())


def doors(triton: str, function: str, gateway: str, key: bytes) -> dict[str, Door]:
    made = [
        Door("sidecar", triton, None),
        Door("function", function, "sidecar", key=key),
        Door("ext-local", gateway, "sidecar", "localhost", expect="local;"),
        Door("ext-spill", gateway, "function", "localhost", spill=True, expect="aws;"),
        Door("fast-local", gateway, "sidecar", FAST_HOST, expect="local;"),
        Door("fast-spill", gateway, "function", FAST_HOST, spill=True, expect="aws;"),
    ]
    return {d.name: d for d in made}


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest rank: a value some stream really saw."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def figures(streams: list[Stream]) -> dict[str, float]:
    good = [s for s in streams if s.problem is None]
    ttft = [s.ttft_ms for s in good]
    gaps = [g for s in good for g in s.gaps_ms]
    return {
        "ttft_p50_ms": median(ttft),
        "ttft_p90_ms": quantile(ttft, 0.9),
        "gap_p50_ms": median(gaps),
        "gap_p90_ms": quantile(gaps, 0.9),
        "tokens_per_s_p50": median([s.tokens_per_s for s in good]),
    }


def summarise(door: Door, streams: list[Stream], rounds: int) -> dict[str, Any]:
    """The door's figures and, against its baseline, the added TTFT and gap (overall and by round)."""
    mine = [s for s in streams if s.door == door.name]
    own = figures(mine)
    row: dict[str, Any] = {
        "kind": "summary",
        "path": door.name,
        "baseline": door.baseline or "",
        "streams": len(mine),
        "bad": len([s for s in mine if s.problem]),
        "problems": dict(Counter(s.problem for s in mine if s.problem)),
        **own,
    }
    if door.baseline is None:
        return row
    base = figures([s for s in streams if s.door == door.baseline])
    by_round = [
        figures([s for s in mine if s.round == r])["ttft_p50_ms"]
        - figures([s for s in streams if s.door == door.baseline and s.round == r])["ttft_p50_ms"]
        for r in range(rounds)
    ]
    return row | {
        "added_ttft_p50_ms": own["ttft_p50_ms"] - base["ttft_p50_ms"],
        "added_ttft_p90_ms": own["ttft_p90_ms"] - base["ttft_p90_ms"],
        "added_ttft_by_round_ms": [round(v, 3) for v in by_round],
        "added_gap_p50_us": (own["gap_p50_ms"] - base["gap_p50_ms"]) * 1000,
    }


def table(rows: list[dict[str, Any]]) -> str:
    headers = "path|vs|ok/streams|TTFT p50 ms|TTFT p90 ms|gap p50 ms|tok/s p50|+TTFT p50 ms|"
    headers += "+TTFT by round ms|+gap p50 us"
    cells = []
    for r in rows:
        spread = r.get("added_ttft_by_round_ms")
        cells.append(
            [
                r["path"],
                r["baseline"] or "-",
                f"{r['streams'] - r['bad']}/{r['streams']}",
                r["ttft_p50_ms"],
                r["ttft_p90_ms"],
                r["gap_p50_ms"],
                r["tokens_per_s_p50"],
                r.get("added_ttft_p50_ms", math.nan),
                f"{min(spread):.2f}..{max(spread):.2f}" if spread else "-",
                r.get("added_gap_p50_us", math.nan),
            ]
        )
    return render_table(headers.split("|"), cells)


def decided(door: Door) -> bool:
    """A one-token stream answered by the expected side (the runner needs a scrape or two first)."""
    body = json.dumps({"text_input": PROMPT, "max_tokens": 1}).encode()
    return one_stream(door, body, [PROMPT.split()[0] + " "], -1).problem is None


def run_rounds(found: dict[str, Door], args: argparse.Namespace, out: Output) -> list[Stream]:
    """Warm every path, then the rounds: stream by stream across the paths, order rotated."""
    words = PROMPT.split()
    expected = [words[i % len(words)] + " " for i in range(args.max_tokens)]
    body = json.dumps(
        {"text_input": PROMPT, "max_tokens": args.max_tokens, "token_delay_ms": args.token_delay_ms}
    ).encode()
    names = list(found)
    for name in names:
        warm = [one_stream(found[name], body, expected, -1) for _ in range(args.warmup)]
        say(f"warmed {name}: problems {[s.problem for s in warm if s.problem] or 'none'}")
    streams: list[Stream] = []
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for _ in range(args.streams):
            streams += [one_stream(found[name], body, expected, rnd) for name in order]
        for name in order:
            mine = [s for s in streams if s.round == rnd and s.door == name]
            row = {"kind": "round", "round": rnd + 1, "path": name, **figures(mine)}
            out.record(row | {"bad": len([s for s in mine if s.problem])})
        say(f"round {rnd + 1}/{args.rounds} done; load average {os.getloadavg()[0]:.2f}")
    return streams


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--streams", type=int, default=20, help="streams per path per round (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured streams per path first (default 3)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per stream (default 32)")
    parser.add_argument("--token-delay-ms", type=float, default=5.0, help="between tokens (default 5)")
    parser.add_argument("--cap", type=int, default=64, help="the aws target's concurrency_cap (default 64)")
    add_output_options(parser)
    args = parser.parse_args(argv)
    if apisix.missing_reason() is not None:
        parser.error(str(apisix.missing_reason()))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(16))
    command = shlex.join(
        ["python", "bench/generate_stream.py", *(argv if argv is not None else sys.argv[1:])]
    )
    out = Output(args.format, args.json_out)
    start = machine_note()
    settings = {k: v for k, v in vars(args).items() if k not in ("format", "json_out")}
    out.record({"kind": "meta", "bench": "generate_stream", "command": command, **start, **settings})
    say(f"load average {start['loadavg_1m']} at the start")
    began, shm_before = time.monotonic(), harness.shm_regions()
    try:
        # A short folder: APISIX's Unix sockets under its copy must fit in 108 bytes.
        with (
            tempfile.TemporaryDirectory(prefix="sw-gs-", dir="/tmp") as tmp,
            chain(Path(tmp), args.cap) as found,
        ):
            for door in found.values():
                wait_until(functools.partial(decided, door), 30, f"{door.name} answering as expected")
            streams = run_rounds(found, args, out)
        rows = [summarise(door, streams, args.rounds) for door in found.values()]
        for row in rows:
            out.record(row)
        end = machine_note()
        out.record({"kind": "end", "wall_s": time.monotonic() - began, **end})
        say(f"done in {time.monotonic() - began:.0f} s; load average {end['loadavg_1m']} at the end")
        if out.table:
            print(
                f"generate_stream, {start['date']}, {start['cpus']} CPUs, {args.rounds} rounds x "
                f"{args.streams} streams per path, {args.max_tokens} tokens {args.token_delay_ms:g} ms "
                f"apart; load average {start['loadavg_1m']} at the start, {end['loadavg_1m']} at the end"
            )
            print(table(rows))
    finally:
        out.close()
        # The tokens model outlives Triton's 5 s exit timeout, which leaves its stubs' regions.
        harness.warn_leaked(shm_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
