"""``python -m gateway_plugin simulate``: every policy over one trace, a sweep, the answer printed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway_plugin.config import ConfigError, SpillwayConfig, load, parse
from gateway_plugin.simulation.baselines import BASELINES
from gateway_plugin.simulation.engine import jobs, simulate
from gateway_plugin.simulation.oracle import Oracle
from gateway_plugin.simulation.results import Measures
from gateway_plugin.simulation.runner_policy import SpillwayRouter, thresholds_modelled
from gateway_plugin.simulation.trace import GENERATORS, RateTrace, Shaping, Trace, TraceError
from gateway_plugin.simulation.trace import load as load_trace
from gateway_plugin.simulation.world import Router

POLICIES: tuple[Callable[[SpillwayConfig], Router], ...] = (SpillwayRouter, *BASELINES)
MAX_SWEEP_VALUES = 50


def add_parser(sub: Any) -> None:
    sim = sub.add_parser(
        "simulate",
        help="replay a traffic trace through the policy and its baselines: cost, SLO, cloud share",
        description="Replay a trace through a discrete-event model of the on-prem cluster and each "
        "cloud target (cold starts, reuse, idle reaping, warm-up pings, billing), routed by the same "
        "decide() the runner runs and, on the same requests, by the baselines all_local, all_cloud, "
        "static_threshold (spill while utilisation > 0.8), least_busy, perfect (greedy, with an exact "
        "view) and the oracle (plans with hindsight over the whole trace). What the model assumes of "
        "the cluster and the clouds is the config's `simulation:` section.",
    )
    sim.add_argument("--config", type=Path, required=True, help="spillway.yaml")
    sim.add_argument(
        "--trace",
        metavar="FILE|GENERATOR",
        help="rates (requests/s, one line per --interval-s), a CSV with a timestamp column, or a "
        f"generator: {', '.join(GENERATORS)}, tuned as e.g. "
        "mmpp:base=20,burst=60,on_s=15,off_s=60,seconds=600",
    )
    sim.add_argument("--interval-s", type=float, default=1.0, help="seconds per line of a rate trace")
    sim.add_argument("--scale", type=float, default=1.0, help="multiply every rate by this")
    sim.add_argument("--duration-s", type=float, default=None, help="stop the trace after this long")
    sim.add_argument("--seed", type=int, default=1, help="the same seed gives the same result")
    sim.add_argument(
        "--confidential-share", type=float, default=0.0, help="share of requests that may not leave (0-1)"
    )
    sim.add_argument(
        "--sheddable-share",
        type=float,
        default=0.0,
        help="share of requests that say they are sheddable (admission.priority_header): refused at "
        "once rather than queued past the latency target when they cannot leave (0-1)",
    )
    sim.add_argument(
        "--sweep",
        metavar="KEY=V1,V2,...",
        help="re-run for each value of a numeric config key, e.g. local.parallelism=1,2,4,8 or "
        "targets.aws.concurrency_cap=10,50",
    )
    sim.add_argument(
        "--frontier",
        action="store_true",
        help="also sweep Spillway's knobs, each baseline's parameter and the oracle's: every (spend, "
        "SLO) point, the Pareto frontier, and whether any point dominates Spillway's default",
    )
    sim.add_argument("--json", action="store_true", help="print one JSON object (default off a terminal)")
    sim.add_argument("--report", type=Path, metavar="DIR", help="write report.html and results.json here")
    cal = sim.add_argument_group(
        "calibration",
        "--calibrate measures the config's first local endpoint (its service time, one request at "
        "a time, and Triton's own compute time) and prints the simulation.cluster settings to use",
    )
    cal.add_argument("--calibrate", action="store_true", help="measure instead of simulating")
    cal.add_argument("--body", type=Path, help="an inference request (KServe v2 JSON) for simulation.model")
    cal.add_argument("--requests", type=int, default=100, help="requests to time (default 100)")


def run(args: argparse.Namespace) -> int:
    try:
        config = load(args.config)
        if args.calibrate:
            return _calibrate(args, config)
        if not args.trace:
            raise TraceError("--trace is required: a trace file or a generator (see --help)")
        trace = load_trace(args.trace, args.interval_s)
        shaping = _shaping(args, config)
        sweep = _sweep(config, args.sweep) if args.sweep else None
    except (ConfigError, TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    progress = Progress(_total_runs(sweep, args.frontier), trace, shaping)
    policies = run_policies(config, trace, shaping, args.seed, progress)
    result: dict[str, Any] = {
        "requests": policies["spillway"].summary()["requests"],
        "policies": {name: m.summary() for name, m in policies.items()},
        "latency_target_ms": policies["spillway"].latency_target_ms,
    }
    if config.thresholds().any:
        result["thresholds"] = thresholds_modelled(config)
    points = []
    if sweep is not None:
        key, variants = sweep
        for value, variant in variants:
            runs = run_policies(variant, trace, shaping, args.seed, progress)
            points.append({"value": value, "policies": {n: m.summary() for n, m in runs.items()}})
        result["sweep"] = {"key": key, "points": points}
    if args.frontier:
        from gateway_plugin.simulation.frontier import sweep as frontier_sweep

        result["frontier"] = frontier_sweep(config, trace, shaping, args.seed, progress.tick)
    progress.done()
    if args.report:
        from gateway_plugin.simulation.report import write_report

        print(f"report: {write_report(args.report, result, policies)}", file=sys.stderr)
    if args.json or not sys.stdout.isatty():
        print(json.dumps(result))
    else:
        print(table(result))
    return 0


def _calibrate(args: argparse.Namespace, config: SpillwayConfig) -> int:
    from gateway_plugin.simulation.calibrate import CalibrationError, measure

    if not config.local.endpoints:
        raise ConfigError(f"{args.config} names no local endpoint to calibrate against (local.endpoints)")
    if args.body is None:
        raise ConfigError(f"--calibrate needs --body: an inference request for {config.simulation.model!r}")
    if not 10 <= args.requests <= 100_000:
        raise ConfigError(f"--requests must be between 10 and 100000, not {args.requests}")
    try:
        body = args.body.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {args.body}: {exc.strerror}") from None
    endpoint = config.local.endpoints[0]
    tty = sys.stderr.isatty()

    def progress(done: int) -> None:
        if tty:
            print(f"\rtimed {done}/{args.requests} requests", end="", file=sys.stderr)

    try:
        found = measure(
            endpoint.url, endpoint.metrics_url, config.simulation.model, body, args.requests, 30.0, progress
        )
    except CalibrationError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    if tty:
        print(file=sys.stderr)
    settings = found.as_settings()
    if args.json or not sys.stdout.isatty():
        print(
            json.dumps(
                {"requests": found.requests, "client_p99_ms": round(found.client_p99_ms, 3), **settings}
            )
        )
    else:
        fields = ", ".join(f"{k}: {v}" for k, v in settings.items())
        print(f"# {found.requests} requests to {endpoint.url}; add to spillway.yaml:")
        print(f"simulation:\n  cluster: {{{fields}}}")
    return 0


def run_policies(
    config: SpillwayConfig, trace: Trace, shaping: Shaping, seed: int, progress: Progress | None = None
) -> dict[str, Measures]:
    out = {}
    for make in POLICIES:
        router = make(config)
        tick = progress.tick(router.name) if progress else None
        out[router.name] = simulate(config, router, trace, shaping, seed, tick)
    if config.simulation.generation is not None:
        return out  # the oracle plans whole answers, not first tokens: no bound to show here
    oracle = Oracle(config, list(jobs(config, trace, shaping, seed)))
    out[oracle.name] = simulate(
        config, oracle, trace, shaping, seed, progress.tick(oracle.name) if progress else None
    )
    return out


def _shaping(args: argparse.Namespace, config: SpillwayConfig) -> Shaping:
    for flag in ("confidential_share", "sheddable_share"):
        share = getattr(args, flag)
        if not 0 <= share <= 1:
            raise TraceError(f"--{flag.replace('_', '-')} must be between 0 and 1, not {share}")
    if not 0 < args.scale <= 1e6:
        raise TraceError(f"--scale must be a positive factor, not {args.scale}")
    if args.duration_s is not None and not args.duration_s > 0:
        raise TraceError(f"--duration-s must be a positive number of seconds, not {args.duration_s}")
    sim = config.simulation
    return Shaping(
        args.scale,
        args.duration_s,
        args.confidential_share,
        sim.request_bytes,
        sim.large_share,
        sim.large_bytes,
        args.sheddable_share,
    )


def _sweep(config: SpillwayConfig, spec: str) -> tuple[str, list[tuple[float, SpillwayConfig]]]:
    """``key=v1,v2``: the config with each value at the dotted key (targets are named by name)."""
    key, sep, values = spec.partition("=")
    raw = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not raw or len(raw) > MAX_SWEEP_VALUES:
        raise ConfigError(f"--sweep {spec!r}: give KEY=V1,V2,... with 1 to {MAX_SWEEP_VALUES} values")
    variants = []
    for text in raw:
        data = config.model_dump()
        parent, leaf = _locate(data, key.strip())
        current = parent[leaf]
        if isinstance(current, bool) or not isinstance(current, int | float | None):
            raise ConfigError(f"--sweep: {key} is not a numeric setting")
        try:
            value = int(text) if isinstance(current, int) else float(text)
        except ValueError:
            raise ConfigError(f"--sweep: {text!r} is not a number for {key}") from None
        parent[leaf] = value
        variants.append((value, parse(data, f"--sweep {key}={text}")))
    return key.strip(), variants


def _locate(data: dict[str, Any], key: str) -> tuple[Any, Any]:
    node: Any = data
    parts = key.split(".")
    for part in parts[:-1]:
        if isinstance(node, list):
            node = next((item for item in node if item.get("name") == part), None)
        elif isinstance(node, dict):
            node = node.get(part)
        if node is None:
            raise ConfigError(f"--sweep: {key} names no setting ({part!r} not found)")
    if not isinstance(node, dict) or parts[-1] not in node:
        raise ConfigError(f"--sweep: {key} names no setting")
    return node, parts[-1]


def _total_runs(sweep: tuple[str, list[Any]] | None, frontier: bool) -> int:
    from gateway_plugin.simulation.baselines import SWEEPS
    from gateway_plugin.simulation.frontier import ORACLE_GRID, SPILLWAY_KNOBS

    points = len(SPILLWAY_KNOBS) + sum(len(s) for s in SWEEPS.values()) + len(ORACLE_GRID)
    return (len(POLICIES) + 1) * (1 + (len(sweep[1]) if sweep else 0)) + (points if frontier else 0)


class Progress:
    """A bar on a terminal; JSON lines on standard error otherwise (a few per run)."""

    def __init__(self, runs: int, trace: Trace, shaping: Shaping) -> None:
        self.runs, self.done_runs = runs, 0
        seconds = trace.seconds / shaping.scale if isinstance(trace, RateTrace) else None
        if shaping.duration_s is not None:
            seconds = min(seconds or shaping.duration_s, shaping.duration_s)
        self.seconds = seconds
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def tick(self, name: str) -> Callable[[float], None]:
        self.done_runs += 1
        run = self.done_runs

        def report(now: float) -> None:
            share = (run - 1 + min(1.0, now / self.seconds if self.seconds else 0.0)) / self.runs
            if self.tty:
                bar = "#" * int(share * 30)
                print(f"\r[{bar:<30}] {share:4.0%} {name} at {now:,.0f} s", end="", file=sys.stderr)
            elif time.monotonic() - self.last > 2:
                self.last = time.monotonic()
                line = {"event": "progress", "policy": name, "share": round(share, 3)}
                print(json.dumps(line), file=sys.stderr)

        return report

    def done(self) -> None:
        if self.tty:
            print("\r" + " " * 70 + "\r", end="", file=sys.stderr)


COLUMNS = (
    ("policy", "{}"),
    ("slo_attainment", "{:.2%}"),
    ("p50_ms", "{:.0f}"),
    ("p99_ms", "{:.0f}"),
    ("cloud_share", "{:.1%}"),
    ("cloud_cost_usd", "{:.4f}"),
    ("warmup_cost_usd", "{:.4f}"),
    ("usd_per_1000_requests", "{:.4f}"),
    ("bursting_saved_pct", "{:.1f}%"),
    ("cold_hits", "{}"),
    ("flaps_per_min", "{:.1f}"),
    ("shed", "{}"),
)


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['requests']:,} requests, latency target {result['latency_target_ms']:g} ms",
        _rows(result["policies"]),
    ]
    if "thresholds" in result:
        lines.insert(1, _thresholds_line(result["thresholds"]))
    for point in result.get("sweep", {}).get("points", []):
        lines.append(f"\n{result['sweep']['key']} = {point['value']}")
        lines.append(_rows(point["policies"]))
    if "frontier" in result:
        from gateway_plugin.simulation.frontier import text

        lines.append(text(result["frontier"]))
    return "\n".join(lines)


def _thresholds_line(names: dict[str, list[str]]) -> str:
    said = []
    if names["modelled"]:
        said.append(f"{', '.join(names['modelled'])} modelled as the cluster's busy share of its parallelism")
    if names["not_modelled"]:
        left = ", ".join(names["not_modelled"])
        said.append(f"{left} not modelled (the cluster model has no memory or CPU): never crossed here")
    return "local.thresholds: " + "; ".join(said)


def _rows(policies: dict[str, dict[str, Any]]) -> str:
    rows = [[name for name, _ in COLUMNS]]
    for name, figures in policies.items():
        rows.append(
            [name, *("-" if figures[key] is None else fmt.format(figures[key]) for key, fmt in COLUMNS[1:])]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    )
