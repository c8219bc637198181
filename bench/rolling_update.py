"""The on-prem cluster through a Kubernetes-style rolling update, behind a real Apache APISIX 3.18:
does public traffic keep spilling, and what do the answers kept on-prem wait, before, during and
after the members are replaced?

Three real tritonservers (``functions.sidecar.Sidecar``, the tests' ``slow`` model: one instance,
100 ms a request, so 30 requests a second for the three) and a loopback stand-in for the cloud
target (answering after ``--cloud-ms``), the stack ``tests/integration/test_apisix_rolling_update.py`` runs
(``testing/tritons.py``): both routes on one APISIX, the ext-plugin route and the fast path.
Closed-loop clients (``--clients``, default 8: at most 80 requests a second at 100 ms an answer,
about twice what the members serve once the gateway's own time is counted), every fourth one
on-prem-only (no classification header), the others ``x-data-classification: public``.

One run per route, three phases under the same load:

    before   three members steady, ``--phase-s`` seconds
    during   each member in turn stopped (SIGTERM: Triton drains its open connections for up to
             its exit timeout, 5 s, then its ports close), started again on the same ports
             once ``--away-s`` have passed since the stop began (as a Deployment with maxSurge 0
             replaces a pod behind its Service), and ``--settle-s`` after it is ready the next
             one goes
    after    three members steady again, ``--phase-s`` seconds

Per phase: requests, the share of public ones that left for the cloud target (their
``x-spillway-decision`` names it), client-measured p50/p99 of the answers the members gave (all
of them, and the on-prem-only ones' p99 alone), 5xx and requests with no answer, and on-prem-only
requests that left (must be 0); in JSON, every answer but a 200 by status and decision
(``not_ok``). The same per step of the update (each member's absence, from its stop to its
ready, and its return). This machine is shared: the ratios during/before and after/before are
against the before phase of the same run. ``max_queue_ms`` bounds what a request kept local may
wait (then it is shed: 503).

The clients are a closed loop, and so are the on-prem-only ones: kept waiting behind public
requests they send less, and the headroom the gateway keeps for them (``onprem_headroom``)
follows the rate it sees. The same load has two steady states, some public requests at home or
none (the on-prem-only ones, answered in 100 ms, then come often enough to claim the headroom);
which one a phase is in shows in its on-prem-only/s and spilled share, and a ratio across a
change of state says as much about the loop as about the update.

    python bench/rolling_update.py [--route both] [--phase-s 15] [--clients 8] [--away-s 4]
        [--settle-s 3] [--cloud-ms 100] [--max-queue-ms MS] [--prefix DIR] [--format auto]

Needs APISIX in a prefix of its own (--prefix, else $SPILLWAY_APISIX_PREFIX, else
/opt/spillway-apisix-bench) and tritonserver. A table on a terminal, JSON lines otherwise;
progress on stderr. Exits 1 if any on-prem-only request left.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apisix_gateway import DEFAULT_PREFIX, check_prefix
from harness import ROOT, Output, add_output_options, machine_note, render_table, say

from gateway_plugin.config.cluster import LocalCluster

sys.path.insert(1, str(ROOT))  # devtools and testing are source-only: importable from the checkout
from devtools import apisix
from testing.tritons import CLOUD, COMPUTE_MS, FAST, LOCAL, PATH, Answer, Load, Member, rolling_cluster

ROUTES = {"ext-plugin": None, "fast-path": FAST}  # the Host header each route is reached with
RATIOS = ("requests_per_s", "spilled", "local_p50_ms", "local_p99_ms", "onprem_only_p99_ms")
COLUMNS = (  # the table's, header and key
    ("route", "route"),
    ("phase", "phase"),
    ("s", "seconds"),
    ("requests", "requests"),
    ("req/s", "requests_per_s"),
    ("public", "public"),
    ("spilled", "spilled"),
    ("local", "local_answers"),
    ("p50 ms", "local_p50_ms"),
    ("p99 ms", "local_p99_ms"),
    ("on-prem-only p99", "onprem_only_p99_ms"),
    ("on-prem-only/s", "onprem_only_per_s"),
    ("public 5xx", "public_5xx"),
    ("on-prem-only 5xx", "onprem_only_5xx"),
    ("no answer", "unanswered"),
    ("on-prem-only left", "onprem_only_left"),
)


@dataclass(frozen=True)
class Window:
    """A stretch of the run: its answers are those that came between ``since`` and ``until``."""

    name: str
    since: float
    until: float


def quantile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def figures(answers: list[Answer], window: Window) -> dict[str, Any]:
    """What the brief of this benchmark asks of one phase, from the clients' own records."""
    public = [a for a in answers if a.public]
    onprem = [a for a in answers if not a.public]
    local_ms = [a.latency_s * 1000 for a in answers if a.local]
    onprem_ms = [a.latency_s * 1000 for a in onprem if a.local]
    seconds = window.until - window.since
    return {
        "phase": window.name,
        "seconds": seconds,
        "requests": len(answers),
        "requests_per_s": len(answers) / seconds if seconds > 0 else float("nan"),
        "public": len(public),
        "spilled": sum(a.left for a in public) / len(public) if public else float("nan"),
        "local_answers": len(local_ms),
        "local_p50_ms": quantile(local_ms, 0.5),
        "local_p99_ms": quantile(local_ms, 0.99),
        "onprem_only_p99_ms": quantile(onprem_ms, 0.99),
        "onprem_only_per_s": len(onprem) / seconds if seconds > 0 else float("nan"),
        "public_5xx": sum(a.status >= 500 for a in public),
        "onprem_only_5xx": sum(a.status >= 500 for a in onprem),
        "unanswered": sum(a.status == 0 for a in answers),
        "onprem_only_left": sum(a.left for a in onprem),
        # every answer but a 200, by status and decision (0: none came)
        "not_ok": dict(Counter(f"{a.status} {a.decision or '-'}" for a in answers if a.status != 200)),
    }


def seconds(text: str) -> float:
    """A duration on the command line: a number, 0 or more."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration of 0 or more")
    return value


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0")
    return value


def ratio(a: float, b: float) -> float:
    return a / b if b == b and b != 0 else float("nan")  # b == b: not NaN


def wait_spilling(load: Load, timeout_s: float) -> bool:
    """Until public requests leave (the signals show the overload); False if they never did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if load.phase(time.monotonic() - 2)["spilled"] > 0.2:
            return True
        time.sleep(0.2)
    return False


def roll(members: list[Member], args: argparse.Namespace) -> list[Window]:
    """Each member stopped, started again on its ports ``away_s`` later, the next ``settle_s``
    after it is ready: the windows of each one's absence and return."""
    steps = []
    for index, member in enumerate(members):
        gone = time.monotonic()
        say(f"  member {index} stopping")
        member.stop()
        say(f"  member {index} stopped ({time.monotonic() - gone:.1f} s: Triton's drain)")
        time.sleep(max(0.0, gone + args.away_s - time.monotonic()))
        member.start()
        ready = time.monotonic()
        say(f"  member {index} ready again ({ready - gone:.1f} s after its stop)")
        time.sleep(args.settle_s)
        steps += [
            Window(f"member {index} away", gone, ready),
            Window(f"member {index} back", ready, time.monotonic()),
        ]
    return steps


def run_route(
    gateway: apisix.Apisix, members: list[Member], name: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One route through the three phases under one load: a record per phase, per step, and the ratios."""
    load = Load(gateway.url + PATH, ROUTES[name], timeout_s=args.request_timeout_s)
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        clients = [pool.submit(load.client, i) for i in range(args.clients)]
        try:
            say(f"{name}: {args.clients} clients; waiting for public requests to spill")
            if not wait_spilling(load, 60):
                say(f"{name}: warning: public requests did not spill within 60 s")
            time.sleep(args.warmup_s)
            start = time.monotonic()
            say(f"{name}: before, {args.phase_s:.0f} s")
            time.sleep(args.phase_s)
            before = Window("before", start, time.monotonic())
            say(f"{name}: during: members replaced one at a time")
            steps = roll(members, args)
            during = Window("during", before.until, time.monotonic())
            say(f"{name}: after, {args.phase_s:.0f} s")
            time.sleep(args.phase_s)
            after = Window("after", during.until, time.monotonic())
        finally:
            load.stop.set()
            for client in clients:
                client.result()
    phases = {w.name: figures(load.between(w.since, w.until), w) for w in (before, during, after)}
    records = [{"kind": "phase", "route": name, **row} for row in phases.values()]
    records += [{"kind": "step", "route": name, **figures(load.between(w.since, w.until), w)} for w in steps]
    for phase in ("during", "after"):
        records.append(
            {
                "kind": "ratio",
                "route": name,
                "phase": f"{phase}/before",
                **{key: ratio(phases[phase][key], phases["before"][key]) for key in RATIOS},
            }
        )
    return records


def table(records: list[dict[str, Any]]) -> str:
    rows = [[r[k] for _, k in COLUMNS] for r in records if r["kind"] in ("phase", "step")]
    ratio_heads = ("route", "ratio", *(h for h, k in COLUMNS if k in RATIOS))
    ratio_rows = [
        [r["route"], r["phase"], *(r[k] for _, k in COLUMNS if k in RATIOS)]
        for r in records
        if r["kind"] == "ratio"
    ]
    return render_table([h for h, _ in COLUMNS], rows) + "\n\n" + render_table(ratio_heads, ratio_rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--route", choices=("ext-plugin", "fast-path", "both"), default="both", help="default: both, in turn"
    )
    parser.add_argument(
        "--phase-s", type=positive, default=15.0, help="the before and after phases (default 15)"
    )
    parser.add_argument(
        "--clients", type=int, default=8, help="closed-loop clients, a quarter on-prem-only (default 8)"
    )
    parser.add_argument(
        "--away-s",
        type=seconds,
        default=4.0,
        help="from a member's stop to its start, its drain included (default 4)",
    )
    parser.add_argument(
        "--settle-s", type=seconds, default=3.0, help="from a member's ready to the next stop (default 3)"
    )
    parser.add_argument(
        "--warmup-s",
        type=seconds,
        default=3.0,
        help="load before the before phase, once spilling (default 3)",
    )
    parser.add_argument(
        "--cloud-ms", type=seconds, default=COMPUTE_MS, help="the cloud stand-in's answer time (default 100)"
    )
    parser.add_argument(
        "--max-queue-ms", type=positive, default=None, help="local.max_queue_ms (default: the config's)"
    )
    parser.add_argument(
        "--request-timeout-s", type=positive, default=60.0, help="a client's wait for one answer"
    )
    parser.add_argument(
        "--prefix", type=Path, default=None, help="APISIX's prefix (default $SPILLWAY_APISIX_PREFIX)"
    )
    add_output_options(parser)
    args = parser.parse_args(argv)
    if args.clients < 2:
        parser.error(f"--clients {args.clients}: at least 2 (one on-prem-only, one public)")
    args.prefix = args.prefix or Path(os.environ.get("SPILLWAY_APISIX_PREFIX") or DEFAULT_PREFIX)
    os.environ["SPILLWAY_APISIX_PREFIX"] = str(args.prefix.resolve())  # what devtools.apisix reads
    os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(16))  # the route's, passed to its runner
    check_prefix()
    command = shlex.join(["python", "bench/rolling_update.py", *(argv if argv is not None else sys.argv[1:])])
    local = {} if args.max_queue_ms is None else {"max_queue_ms": args.max_queue_ms}
    out = Output(args.format, args.json_out)
    out.record(
        {
            "kind": "run",
            "command": command,
            **machine_note(),
            "members": 3,
            "compute_ms": COMPUTE_MS,
            "clients": args.clients,
            "onprem_only_clients": len(range(0, args.clients, 4)),
            "cloud": CLOUD,
            "cloud_ms": args.cloud_ms,
            "local": {**LOCAL, "max_queue_ms": args.max_queue_ms or LocalCluster().max_queue_ms},
        }
    )
    say(f"APISIX in {apisix.prefix()}; {command}")
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="spillway-rolling-") as tmp:
        say("starting three tritonservers, the cloud stand-in and APISIX")
        with rolling_cluster(Path(tmp), member_logs=True, **local) as (gateway, members, cloud):
            cloud.delay_s = args.cloud_ms / 1000
            for name in ROUTES if args.route == "both" else (args.route,):
                done = run_route(gateway, members, name, args)
                for record in done:
                    out.record(record)
                records += done
    out.close()
    if out.table:
        print(table(records))
    left = sum(r.get("onprem_only_left", 0) for r in records if r["kind"] == "phase")
    if left:
        say(f"{left} on-prem-only request(s) left for the cloud target")
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
