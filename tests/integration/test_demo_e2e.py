"""The whole hybrid, end to end: the README's first command in its short form, checked.

One run of the demo per gateway serves every test here: on a real Apache APISIX (skipped where
``scripts/install-apisix.sh`` has not installed one in ``devtools.apisix.prefix()``) and on the
development gateway.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from devtools import apisix
from devtools.demo_cli import resolve_gateway
from testing.paths import ROOT

pytestmark = pytest.mark.integration

STEADY_LOCAL_SHARE = 0.95


class Run(NamedTuple):
    done: subprocess.CompletedProcess[str]
    out: Path
    gateway: str


@pytest.fixture(scope="module", params=["apisix", "dev"])
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    gateway: str = request.param
    if gateway == "apisix" and apisix.missing_reason() is not None:
        pytest.skip(apisix.missing_reason() or "")
    out = tmp_path_factory.mktemp(f"demo-{gateway}") / "out"
    # As a person runs it: no route token or signing key set beforehand.
    env = {k: v for k, v in os.environ.items() if k not in ("SPILLWAY_ROUTE_TOKEN", "SPILLWAY_SIGNING_KEY")}
    done = subprocess.run(
        [sys.executable, "-m", "devtools", "demo", "--short", "--gateway", gateway, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert (out / "summary.json").exists(), done.stderr[-3000:]
    return Run(done, out, gateway)


def _summary(out: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def test_demo_spills_the_burst_keeps_sensitive_data_home_and_reports(
    demo: Run,
) -> None:
    done, out, _ = demo
    summary = _summary(out)
    assert summary["checks"]["every_request_answered_once"], summary
    assert summary["checks"]["no_sensitive_request_in_cloud_logs"], summary
    assert summary["checks"]["cold_hits_within_warmup_bound"], summary
    assert done.returncode == 0, done.stderr[-3000:]
    cloud = {t: v for t, v in summary["targets"].items() if t in ("aws", "aliyun")}
    assert sum(v["requests"] for v in cloud.values()) > 0, "the burst did not spill"
    assert summary["cloud_requests_in_logs"] == sum(v["requests"] for v in cloud.values()), (
        "the function instances' own logs must account for every request the gateway sent out"
    )
    assert summary["targets"]["local"]["sensitive"] > 0 and all(v["sensitive"] == 0 for v in cloud.values())
    gateway = json.loads((out / "results.json").read_text())["gateway"]
    assert gateway["name"] == summary["gateway"]["name"] == demo.gateway
    report = (out / "report.html").read_text()
    assert report.startswith("<!doctype html>") and f"Gateway: {gateway['label']}." in report
    for chart in ("latency", "split", "cold", "cost"):
        assert re.search(rf'<img class="chart" id="chart-{chart}" [^>]*src="data:image/png;base64,', report)
    assert json.loads((out / "results.json").read_text())["sent"] == summary["requests"]
    # The demo's own Prometheus scraped the runner, the cluster and the function instances: the
    # cost, warm-up and functions dashboards are drawn from it into the report, every panel with
    # data but the first-token times of LLM streams, which the demo's add_sub does not make.
    drawn = json.loads((out / "results.json").read_text())["dashboards"]
    for name in ("spillway-cost.json", "spillway-warmup.json", "spillway-functions.json"):
        no_streams = ["Streams: time to first token (p50, p99)"] if name == "spillway-functions.json" else []
        assert drawn[name]["without_data"] == no_streams, drawn
    assert report.count("<img class='chart' alt='Spillway: ") == len(drawn) == 4
    progress = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"event"')]
    assert progress and all(p["event"] == "progress" for p in progress), "not a terminal: JSON lines"
    assert json.loads(done.stdout.splitlines()[-1])["event"] == "summary"


def test_the_steady_phase_stays_local_and_the_burst_spills(
    demo: Run,
) -> None:
    """Half the local capacity stays on premises; one and a half times it does not fit and spills."""
    phases = _summary(demo.out)["phases"]
    assert phases["steady"]["local_share"] >= STEADY_LOCAL_SHARE, phases
    assert phases["steady"]["cloud_share"] <= 1 - STEADY_LOCAL_SHARE, phases
    # 30/s against 20/s: at least a third of the burst cannot be served on premises in time.
    assert phases["burst"]["cloud_share"] >= 0.2, phases


def test_once_the_burst_backlog_is_answered_requests_stay_on_premises(
    demo: Run,
) -> None:
    """The phase after the burst starts on the burst's backlog: spilling then is the policy's
    hysteresis at work. Once the cluster has answered that backlog (and the runner could know it),
    the load fits again. A short run has a few dozen requests there, so a bound with room: before
    the runner stopped trusting a drained cluster's stale answer times, a fifth still spilled."""
    summary = _summary(demo.out)
    assert summary["after_burst"]["local_share_once_drained"] >= 0.85, summary["after_burst"]


def test_auto_picks_apisix_where_it_is_installed() -> None:
    assert resolve_gateway("auto") == ("dev" if apisix.missing_reason() else "apisix")
    assert resolve_gateway("dev") == "dev"
