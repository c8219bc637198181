"""The demo's front: settings from the command line, live progress, the summary and the report.

On a terminal, one view refreshed in place: the set-up steps, then the phase, a progress bar over
the whole load and the live per-target table. Otherwise JSON lines on stderr (one per step) and
the summary as one JSON line on stdout.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.logging import RichHandler
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from devtools import apisix, demo
from devtools.demo_report import COLORS, percentile, report_html, summarize
from devtools.loadgen import LoadRun, Phase, Sample, phase_at


def live_rows(samples: Iterable[Sample]) -> dict[str, dict[str, float]]:
    """Per target, the requests answered so far: count, share, p50 and p99 latency, cold hits."""
    latencies: dict[str, list[float]] = defaultdict(list)
    cold: dict[str, int] = defaultdict(int)
    sensitive: dict[str, int] = defaultdict(int)
    for sample in list(samples):
        if sample.latency_s > 0:  # set last, once the answer (or the error) is in
            target = sample.target or "error"
            latencies[target].append(sample.latency_s * 1000)
            cold[target] += sample.cold
            sensitive[target] += sample.sensitive
    total = sum(len(v) for v in latencies.values()) or 1
    return {
        target: {
            "requests": len(lat),
            "share": len(lat) / total,
            "p50_ms": percentile(lat, 0.5),
            "p99_ms": percentile(lat, 0.99),
            "cold": cold[target],
            "sensitive": sensitive[target],
        }
        for target, lat in sorted(latencies.items(), key=lambda kv: (kv[0] != "local", kv[0]))
    }


class JsonLines:
    """Not on a terminal: one JSON line per step on stderr."""

    def step(self, text: str) -> None:
        print(json.dumps({"event": "progress", "message": text}), file=sys.stderr, flush=True)

    def load_started(self, phases: list[Phase], load: LoadRun, started_at: float) -> None:
        pass

    def load_finished(self) -> None:
        pass


class LiveView:
    """On a terminal: the steps as they happen, and below them one view refreshed in place."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.status = "starting"
        self.phases: list[Phase] = []
        self.load: LoadRun | None = None
        self.started_at = 0.0
        self.finished_at: float | None = None
        self._live = Live(console=console, get_renderable=self.render, refresh_per_second=4)
        self._handlers: list[logging.Handler] = []

    def __enter__(self) -> LiveView:
        root = logging.getLogger()
        self._handlers = root.handlers[:]
        root.handlers = [RichHandler(console=self.console, show_path=False)]
        self._live.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._live.stop()
        logging.getLogger().handlers = self._handlers

    def step(self, text: str) -> None:
        self.status = text
        self.console.print(f"[dim]•[/dim] {text}")

    def load_started(self, phases: list[Phase], load: LoadRun, started_at: float) -> None:
        self.phases, self.load, self.started_at = phases, load, started_at

    def load_finished(self) -> None:
        self.finished_at = time.monotonic()

    def render(self) -> RenderableType:
        load = self.load
        if load is None:
            return Spinner("dots", Text(self.status, style="cyan"))
        total = sum(p.seconds for p in self.phases)
        elapsed = (self.finished_at or time.monotonic()) - self.started_at
        index, phase = phase_at(self.phases, elapsed)
        if elapsed < total:
            state = Text.assemble(("phase ", "dim"), (phase.name, "bold yellow"), f"  {phase.rate_per_s:g}/s")
        elif self.finished_at is None:
            state = Text.assemble(("waiting for the last answers", "bold yellow"))
        else:
            state = Text.assemble(("load done", "bold green"))
            index = len(self.phases)
        steps = Text("  ")
        for i, p in enumerate(self.phases):
            mark, style = (
                ("✓", "green") if i < index else ("▶", "bold yellow") if i == index else ("·", "dim")
            )
            steps.append(f"{mark} {p.name} {p.seconds:g} s  ", style=style)
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=total, completed=min(elapsed, total), width=50),
            Text(f"{min(elapsed, total):5.1f} / {total:g} s", style="bold"),
            Text(f"sent {load.sent}  answered {load.answered}", style="dim"),
        )
        return Group(Text.assemble(state, steps), bar, self._table(load))

    @staticmethod
    def _table(load: LoadRun) -> Table:
        table = Table(title=None, show_edge=False, header_style="bold")
        for name in ("target", "requests", "share", "p50 ms", "p99 ms", "cold", "confidential"):
            table.add_column(name, justify="left" if name == "target" else "right")
        for target, row in live_rows(load.samples).items():
            table.add_row(
                Text(target, style=COLORS.get(target, COLORS["unknown"])),
                f"{row['requests']:.0f}",
                f"{row['share']:.0%}",
                f"{row['p50_ms']:.1f}",
                f"{row['p99_ms']:.1f}",
                f"{row['cold']:.0f}",
                f"{row['sensitive']:.0f}",
            )
        return table


def _print_summary(console: Console, summary: dict[str, Any], report: Path) -> None:
    phases = Table(title="per phase", show_edge=False, header_style="bold")
    for name in ("phase", "requests", "local", "cloud", "p99 ms", "cluster p99 ms", "cold"):
        phases.add_column(name, justify="left" if name == "phase" else "right")
    for name, p in summary["phases"].items():
        phases.add_row(
            name,
            str(p["requests"]),
            f"{p['local_share']:.1%}",
            f"{p['cloud_share']:.1%}",
            f"{p['p99_ms']}",
            f"{p['local_p99_ms']}",
            str(p["cold_hits"]),
        )
    console.print(f"gateway: {summary['gateway']['label']}", highlight=False)
    console.print(phases)
    back = summary["after_burst"]
    console.print(
        f"after the burst: backlog answered in {back['backlog_drained_s']:g} s, last cloud request "
        f"{back['last_cloud_s']:g} s after it, {back['local_share_once_drained']:.1%} local from then on",
        highlight=False,
    )
    for target, row in summary["targets"].items():
        spend = summary["spend_usd"].get(target)
        console.print(
            f"{target:<8} {row['requests']:>6} requests  p50 {row['p50_ms']:>7} ms  "
            f"p99 {row['p99_ms']:>7} ms  cold {row['cold_hits']}  confidential {row['sensitive']}"
            + (f"  est. ${spend:.6f}" if spend is not None else ""),
            highlight=False,
        )
    for name, ok in summary["checks"].items():
        console.print(f"{'[green]ok  [/green]' if ok else '[red]FAIL[/red]'} {name.replace('_', ' ')}")
    console.print(f"report: {report}", highlight=False)


def resolve_gateway(choice: str) -> demo.Gateway:
    """``auto``: a real APISIX when one is installed (``scripts/install-apisix.sh``), else the
    development gateway. ``apisix`` without one installed is an error."""
    if choice == "dev":
        return "dev"
    reason = apisix.missing_reason()
    if reason is None:
        return "apisix"
    if choice == "auto":
        return "dev"
    raise RuntimeError(reason)


def run_demo(out: Path | None, short: bool, burst_rps: float | None, gateway: str = "auto") -> int:
    out_dir = (out or Path(f"spillway-demo-{time.strftime('%Y%m%d-%H%M%S')}")).resolve()
    options: dict[str, Any] = {"out_dir": out_dir}
    if short:
        options.update(steady_s=4, burst_s=8, cooldown_s=4, warmup_every_s=8)
    if burst_rps is not None:
        options["burst_rps"] = burst_rps
    try:
        settings = demo.DemoSettings(**options, gateway=resolve_gateway(gateway))
    except RuntimeError as exc:
        print(f"error: --gateway apisix: {exc}", file=sys.stderr)
        return 2
    try:
        if sys.stderr.isatty():
            with LiveView(Console(stderr=True)) as view:
                result = demo.run(settings, view)
        else:
            result = demo.run(settings, JsonLines())
    except KeyboardInterrupt:
        print("interrupted; every process the demo started was stopped", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}; logs are in {out_dir}", file=sys.stderr)
        return 1
    (out_dir / "results.json").write_text(json.dumps(result, indent=1))
    summary = summarize(result)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    report = out_dir / "report.html"
    report.write_text(report_html(result, summary))
    if sys.stdout.isatty():
        _print_summary(Console(), summary, report)
    else:
        print(json.dumps({"event": "summary", **summary, "report": str(report)}))
    return 0 if summary["ok"] else 1
