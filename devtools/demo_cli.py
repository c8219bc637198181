"""The demo's front: settings from the command line, live progress, the summary and the report."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from devtools import demo
from devtools.demo_report import report_html, summarize


def _progress(text: str, live: bool = False) -> None:
    if sys.stderr.isatty():
        if live:
            sys.stderr.write("\x1b[2J\x1b[H" + text + "\n")
        else:
            sys.stderr.write(f"• {text}\n")
        sys.stderr.flush()
    elif not live:
        print(json.dumps({"event": "progress", "message": text}), file=sys.stderr, flush=True)


def run_demo(out: Path | None, short: bool, burst_rps: float | None) -> int:
    out_dir = (out or Path(f"spillway-demo-{time.strftime('%Y%m%d-%H%M%S')}")).resolve()
    settings = demo.DemoSettings(out_dir=out_dir)
    if short:
        settings = dataclasses.replace(settings, steady_s=4, burst_s=8, cooldown_s=4, warmup_every_s=8)
    if burst_rps is not None:
        settings = dataclasses.replace(settings, burst_rps=burst_rps)
    try:
        result = demo.run(settings, _progress)
    except KeyboardInterrupt:
        print("interrupted; every process the demo started was stopped", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}; logs are in {out_dir}", file=sys.stderr)
        return 1
    demo.write_results(result, out_dir)
    summary = summarize(result)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "report.html").write_text(report_html(result, summary))
    if sys.stdout.isatty():
        for target, row in summary["targets"].items():
            print(
                f"{target:<8} {row['requests']:>6} requests  p50 {row['p50_ms']:>7} ms  "
                f"p99 {row['p99_ms']:>7} ms  cold {row['cold_hits']}  confidential {row['sensitive']}"
            )
        for name, ok in summary["checks"].items():
            print(f"{'ok  ' if ok else 'FAIL'} {name.replace('_', ' ')}")
        print(f"report: {out_dir / 'report.html'}")
    else:
        print(json.dumps({"event": "summary", **summary, "report": str(out_dir / "report.html")}))
    return 0 if summary["ok"] else 1
