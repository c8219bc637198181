"""What the warm-up's pings cost, as its report counts it: every ping sent in every wave, priced as
the plan prices a month of them, added up across rounds from the last report, and from zero when
there is no last report to read; and the runner showing that counter again on its /metrics."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from functions.contract import WARMUP_SPEND_METRIC, WarmupReport
from gateway_plugin.books.state import GatewayState
from gateway_plugin.books.warm_instances import read_warm_counts
from gateway_plugin.config import SpillwayConfig, TargetCost
from gateway_plugin.costs import monthly_warm_cost_usd, warm_ping_cost_usd
from testing.gateway import gateway_state
from testing.http import QuietHandler, http_server_thread
from warmup.cli import main
from warmup.pinger import TargetResult
from warmup.report import prometheus_text, read_spent

# One instance answers every ping: two wanted are never reached, so every wave is sent.
ONE_INSTANCE = WarmupReport(
    instance_id="i-1", cold=False, init_ms=1, uptime_s=1, triton_ready=True, models_ready=()
).model_dump_json()
COST = {"usd_per_request": 0.001, "memory_gb": 2.0, "usd_per_gb_second": 0.0001, "usd_per_gpu_second": 0.002}
DWELL_MS = 500
WAVES = 3
PER_PING = 0.001 + 0.5 * (2.0 * 0.0001 + 0.002)


@pytest.fixture
def one_instance() -> Iterator[str]:
    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.reply(ONE_INSTANCE.encode())

    with http_server_thread(Handler) as url:
        yield url


def _config(tmp: Path, url: str) -> Path:
    config = {
        "targets": [{"name": "fn", "kind": "http", "url": url, "signing_key_env": None, "cost": COST}],
        "warmup": {
            "targets": {"fn": {"instances": 2, "dwell_ms": DWELL_MS}},
            "waves": WAVES,
            "ping_timeout_s": 10,
            "report_file": str(tmp / "warm.prom"),
        },
    }
    path = tmp / "spillway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _round(config: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["run", "--once", "--json", "--config", str(config)]) == 1  # 1 of 2 warm: short
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (target,) = [e for e in events if e["event"] == "target"]
    return target


def test_the_ping_price_is_the_plans(tmp_path: Path) -> None:
    cost = TargetCost.model_validate(COST)
    assert warm_ping_cost_usd(cost, DWELL_MS) == pytest.approx(PER_PING)
    assert monthly_warm_cost_usd(cost, 3, 15.0, DWELL_MS) == pytest.approx(PER_PING * 3 * 15 * 24 * 30)


def test_every_ping_sent_is_counted_and_the_counter_adds_up_across_rounds(
    tmp_path: Path, one_instance: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, one_instance)
    report = tmp_path / "warm.prom"
    first = _round(config, capsys)
    assert first["waves"] == WAVES and first["pings"] == 2 * WAVES
    assert read_spent(report.read_text()) == {"fn": pytest.approx(2 * WAVES * PER_PING)}
    _round(config, capsys)
    assert read_spent(report.read_text()) == {"fn": pytest.approx(2 * 2 * WAVES * PER_PING)}
    (family,) = [
        f for f in text_string_to_metric_families(report.read_text()) if f.name == WARMUP_SPEND_METRIC
    ]
    assert family.type == "counter"
    # No _created sample: the counter began with the report file, not with this round.
    assert [s.name for s in family.samples] == [f"{WARMUP_SPEND_METRIC}_total"]


@pytest.mark.parametrize(
    "last_report",
    [None, "this is { not prometheus text\n", f'{WARMUP_SPEND_METRIC}_total{{target="fn"}} -5\n'],
    ids=["missing", "not-prometheus-text", "negative"],
)
def test_without_a_readable_last_report_the_counter_starts_from_zero(
    tmp_path: Path,
    one_instance: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    last_report: str | None,
) -> None:
    config = _config(tmp_path, one_instance)
    report = tmp_path / "warm.prom"
    if last_report is not None:
        report.write_text(last_report)
    with caplog.at_level(logging.WARNING, "spillway.warmup"):
        _round(config, capsys)
    assert read_spent(report.read_text()) == {"fn": pytest.approx(2 * WAVES * PER_PING)}
    assert ("counts from zero" in caplog.text) == (last_report is not None)


def _runner_shows(state: GatewayState, report: bytes) -> dict[str, float]:
    state.warm_counts(*read_warm_counts(report.decode()))
    text = generate_latest(state.metrics.registry).decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == WARMUP_SPEND_METRIC]
    assert family.type == "counter"
    return {s.labels["target"]: s.value for s in family.samples}


def test_the_runner_shows_the_reports_counter_as_reported() -> None:
    """As the file says, each time: the same value in every runner that reads it, a lower one a
    reset, a target the runner does not know left out, nothing before the first reading."""
    config = SpillwayConfig.model_validate(
        {
            "targets": [{"name": "fn", "kind": "http", "url": "https://fn.example", "signing_key_env": None}],
            "metrics": {"listen": None},
        }
    )
    state = gateway_state(config)
    assert _runner_shows(state, b"") == {}
    report = prometheus_text([TargetResult("fn", 1), TargetResult("gone", 1)], {"fn": 0.25, "gone": 1.0})
    assert _runner_shows(state, report) == {"fn": 0.25}
    assert _runner_shows(state, prometheus_text([TargetResult("fn", 1)], {"fn": 0.01})) == {"fn": 0.01}
    assert _runner_shows(state, prometheus_text([TargetResult("fn", 1)])) == {}
