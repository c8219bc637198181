"""``python -m warmup``: keep function instances warm, from cron or as a long-running process."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from gateway_plugin.config import ConfigError, SpillwayConfig, load
from warmup.pinger import TargetResult
from warmup.report import line, summary
from warmup.rounds import PlanRow, measured_rates, plan, run_round, write_report
from warmup.transports import check_signing_keys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m warmup",
        description="Keep as many cloud function instances warm as the expected overflow needs, and "
        "verify it: N overlapping pings per target, each holding its instance, until N distinct "
        "instances answer warm. Reads the warmup section of spillway.yaml.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="ping every target; once (for cron) or every warmup.interval_s",
        description="Exit status 1 when a target ended a round with fewer warm instances "
        "than wanted (with --once), 2 on a bad config.",
    )
    run.add_argument("--config", type=Path, required=True)
    run.add_argument("--once", action="store_true", help="one round, then exit (cron, CronJob)")
    run.add_argument("--json", action="store_true", help="JSON lines even on a terminal")
    plan_cmd = sub.add_parser("plan", help="print each target's instance count, schedule and monthly cost")
    plan_cmd.add_argument("--config", type=Path, required=True)
    plan_cmd.add_argument("--json", action="store_true", help="JSON even on a terminal")
    return parser


class Output:
    """Progress on a terminal, JSON lines when not; whole lines only, whichever thread writes."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._lock = threading.Lock()

    def event(self, kind: str, text: str, **data: object) -> None:
        if self.as_json:
            text = json.dumps({"event": kind, "at": datetime.datetime.now(datetime.UTC).isoformat(), **data})
        with self._lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def wave(self, result: TargetResult) -> None:
        self.event(
            "wave",
            f"  {result.target}: wave {result.waves}: {len(result.warm)}/{result.wanted} warm",
            target=result.target,
            wave=result.waves,
            warm=len(result.warm),
            wanted=result.wanted,
        )


def _plan_text(row: PlanRow) -> str:
    provisioned = (
        "not priced" if row.provisioned_monthly_usd is None else f"about ${row.provisioned_monthly_usd}/month"
    )
    pings, held = ("", " (in use)") if row.provisioned else (" (in use)", "")
    return (
        f"{row.target}: {row.instances} instance(s), {row.how}; {row.schedule}; "
        f"pings about ${row.monthly_usd}/month{pings}, provisioned concurrency {provisioned}{held}"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Output(args.json or not sys.stdout.isatty())
    try:
        config = load(args.config)
        check_signing_keys(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not config.warmup.targets:
        print(f"error: {args.config} has no warmup.targets; add one per target to keep warm", file=sys.stderr)
        return 2
    if args.command == "plan":
        for row in plan(config, datetime.datetime.now(datetime.UTC), measured_rates(config)):
            out.event("plan", _plan_text(row), **asdict(row))
        return 0
    while True:
        short = _round(config, out)
        if args.once:
            return 1 if short else 0
        time.sleep(config.warmup.interval_s)


def _round(config: SpillwayConfig, out: Output) -> bool:
    rows = plan(config, datetime.datetime.now(datetime.UTC), measured_rates(config))
    out.event(
        "round",
        "warming " + ", ".join(f"{r.target} x{r.instances}" for r in rows),
        targets={r.target: r.instances for r in rows},
    )
    results = run_round(config, rows, out.wave)
    write_report(config, results)
    for result in results:
        out.event("target", line(result), **summary(result))
    short = [r.target for r in results if not r.ok]
    if short:
        print(
            f"error: fewer warm instances than wanted for {', '.join(short)}; see the errors above",
            file=sys.stderr,
        )
    return bool(short)
