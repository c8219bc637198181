"""Warm-up: sizing, payloads, reports and wave logic; then a local pool of real function instances."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from functions.contract import WarmupPing, WarmupReport
from functions.events import parse_event
from gateway_plugin.books.metrics import RunnerMetrics
from gateway_plugin.books.warm_instances import read_warm_report
from gateway_plugin.config import SpillwayConfig, Target, WarmTarget
from gateway_plugin.config.warmup import littles_law, scheduled, wanted
from testing.function import load_event, local_pool, model_repository
from testing.http import QuietHandler, http, http_server_thread, wait_until
from testing.paths import ROOT
from warmup import schedules
from warmup.demand import overflow_rates
from warmup.pinger import TargetResult, warm_target
from warmup.report import prometheus_text
from warmup.rounds import plan
from warmup.transports import HttpTransport, PingFailed, pooled_session

SPEC = WarmTarget.model_validate(
    {
        "instances": 1,
        "dwell_ms": 500,
        "models": ["add_sub"],
        "windows": [
            {"start": "08:00", "end": "20:00", "instances": 4},
            {"start": "22:00", "end": "02:00", "instances": 2},
        ],
    }
)


def test_windows_wrap_midnight_and_fall_back_to_the_fixed_count() -> None:
    assert scheduled(SPEC, datetime.time(9, 0)) == 4
    assert scheduled(SPEC, datetime.time(23, 30)) == 2 and scheduled(SPEC, datetime.time(1, 0)) == 2
    assert scheduled(SPEC, datetime.time(21, 0)) == 1


def test_adaptive_sizing_is_littles_law_within_floor_and_ceiling() -> None:
    assert littles_law(10, 0.25, 1.5, 0, 20) == 4
    assert littles_law(1000, 1, 2, 0, 20) == 20 and littles_law(0, 1, 2, 3, 20) == 3
    spec = WarmTarget.model_validate(
        {"instances": 2, "adaptive": {"metrics_url": "http://x", "headroom": 1.0}}
    )
    assert wanted(spec, datetime.time(12), 40, 0.1) == 4
    assert wanted(spec, datetime.time(12), 1, 0.1) == 2, "never below the schedule"
    assert wanted(spec, datetime.time(12), None, 0.1) == 2, "no rate: the schedule"


def test_cloud_schedule_payloads_are_the_contract_and_parse_as_pings() -> None:
    ping = WarmupPing(dwell_ms=500, models=("add_sub",))
    eventbridge = schedules.eventbridge_schedule(SPEC, 240)
    # One aligned cron tick for every schedule (as the modules deploy them), never rate()/@every.
    assert eventbridge["schedule_expression"] == "cron(0/4 * * * ? *)"
    assert eventbridge["schedule_expression_timezone"] == "UTC"
    assert eventbridge["flexible_time_window"] == {"mode": "OFF"}
    assert parse_event(eventbridge["input"]) == ping
    timer = schedules.fc_timer_trigger(SPEC, 240)
    assert timer["cronExpression"] == "0 0/4 * * * *"
    assert timer["enable"] is True
    event = {**load_event("fc_timer.json"), "payload": timer["payload"]}
    assert parse_event(event) == ping
    assert eventbridge["input"] == timer["payload"] == schedules.ping_payload(SPEC)
    assert schedules.eventbridge_schedule(SPEC, 30)["schedule_expression"] == "cron(0/1 * * * ? *)"
    assert schedules.fc_timer_trigger(SPEC, 7200)["cronExpression"] == "0 0 * * * *"
    line = schedules.crontab_line(240, Path("/etc/spillway/spillway.yaml"))
    assert line.startswith("*/4 * * * * ") and "python -m warmup run --once" in line


def test_report_file_round_trips_to_the_gateways_warm_pools() -> None:
    report = WarmupReport(
        instance_id="i-1", cold=True, init_ms=1500, uptime_s=2, triton_ready=True, models_ready=("m",)
    )
    result = TargetResult("aws", 2, warm={"i-1": report, "i-2": report}, cold={"i-1"})
    text = prometheus_text([result, TargetResult("ali", 1, failed=1, errors=["boom"])]).decode()
    assert read_warm_report(text) == {"aws": ["i-1", "i-2"]}
    assert 'spillway_warmup_wanted_instances{target="ali"} 1.0' in text


class FakeInstances:
    """Stands in for a platform in a unit test of the wave logic (the integration tests use a real pool)."""

    def __init__(self, platform_gives: list[int]) -> None:
        self.platform_gives = platform_gives
        self.calls = 0
        self.lock = threading.Lock()

    def ping(self, payload: str, timeout_s: float) -> WarmupReport:
        with self.lock:
            self.calls += 1
            instance = self.platform_gives[(self.calls - 1) % len(self.platform_gives)]
        if instance < 0:
            raise PingFailed("timed out")
        return WarmupReport(
            instance_id=f"i-{instance}",
            cold=instance > 1,
            init_ms=1000,
            uptime_s=1,
            triton_ready=True,
            models_ready=(),
        )


def test_waves_continue_until_n_distinct_instances_answered() -> None:
    platform = FakeInstances([1, 1, 2, 2, 3, -1])
    result = warm_target("t", platform, 3, "{}", models=[], probe=False, waves=5, timeout_s=1)
    assert result.ok and set(result.warm) == {"i-1", "i-2", "i-3"} and result.waves == 2
    assert result.failed == 0 or result.errors == ["timed out"]
    stuck = warm_target("t", FakeInstances([1]), 2, "{}", models=[], probe=False, waves=3, timeout_s=1)
    assert not stuck.ok and stuck.waves == 3 and len(stuck.warm) == 1


@pytest.mark.integration
def test_overlapping_pings_reach_distinct_real_instances_and_keep_them_warm(tmp_path: Path) -> None:
    repo = model_repository(tmp_path, "add_sub")
    with local_pool(repo, max_instances=3, idle_ttl_s=4.0) as (url, pool):
        target = Target(name="pool", kind="http", url=url, signing_key_env=None)
        transport = HttpTransport(target, pooled_session())
        payload = schedules.ping_payload(WarmTarget(dwell_ms=1500, models=["add_sub"], probe=True))
        first = warm_target(
            "pool", transport, 3, payload, models=["add_sub"], probe=True, waves=3, timeout_s=60
        )
        assert first.ok and len(first.warm) == 3, first
        assert first.cold == set(first.warm), "the first round started three instances"
        assert all(r.models_ready == ("add_sub",) for r in first.warm.values())
        # Rounds back to back (each holds its instances for the dwell) until the first round's
        # instances have lived past the idle TTL: without the pings the pool would have reaped them.
        kept_since = time.monotonic()
        while time.monotonic() - kept_since <= 1.5 * pool.settings.idle_ttl_s:
            again = warm_target(
                "pool", transport, 3, payload, models=["add_sub"], probe=True, waves=3, timeout_s=60
            )
            assert set(again.warm) == set(first.warm) and not again.cold, "pings kept the same instances warm"
        assert pool.stats.cold_starts == 3
        wait_until(lambda: pool.live == 0, 20, "idle instances reaped without pings")


@contextmanager
def gateway_metrics() -> Iterator[tuple[RunnerMetrics, str]]:
    """The runner's real metrics families on a real loopback endpoint."""
    from functions.sidecar import free_port

    metrics = RunnerMetrics()
    port = free_port()
    assert metrics.serve(f"127.0.0.1:{port}")
    yield metrics, f"http://127.0.0.1:{port}/metrics"


def test_sizing_follows_the_overflow_the_gateway_reports() -> None:
    now = [0.0]

    with gateway_metrics() as (metrics, metrics_url):
        metrics.decisions.labels("pool", "overflow_warm").inc(100)

        def two_seconds_of_overflow(seconds: float) -> None:
            """While the sampler waits: 80 more cloud decisions in 2 s, i.e. 40 per second."""
            metrics.decisions.labels("pool", "overflow_warm").inc(80)
            now[0] += 2.0

        rate = overflow_rates(metrics_url, 2.0, sleep=two_seconds_of_overflow, clock=lambda: now[0])["pool"]
        assert rate == 40.0
        config = SpillwayConfig.model_validate(
            {
                "targets": [
                    {"name": "pool", "kind": "http", "url": "http://x", "cost": {"expected_duration_ms": 100}}
                ],
                "warmup": {
                    "targets": {
                        "pool": {
                            "instances": 1,
                            "adaptive": {"metrics_url": metrics_url, "headroom": 1.5, "ceiling": 50},
                        }
                    }
                },
            }
        )
        row = plan(config, datetime.datetime.now(datetime.UTC), {"pool": rate})[0]
        assert row.instances == littles_law(rate, 0.1, 1.5, 0, 50) and row.instances >= 5
        assert row.monthly_usd > 0


@contextmanager
def misbehaving(kind: str) -> Iterator[str]:
    """A target that answers 503, a body that is no warm-up report, or ("hang") nothing at all
    until the test is done with it."""
    done = threading.Event()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            if kind == "hang":
                done.wait(60)
            status, body = (503, b"busy") if kind == "5xx" else (200, b'{"hello": "not a warm-up report"}')
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with http_server_thread(Handler) as url:
        try:
            yield url
        finally:
            done.set()


def run_cli(config: dict[str, Any], tmp: Path) -> tuple[int, list[dict[str, Any]], str]:
    path = tmp / "spillway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALIBABA", "AWS_"))}
    done = subprocess.run(
        [sys.executable, "-m", "warmup", "run", "--once", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, events, done.stderr


@pytest.mark.integration
def test_faulty_targets_are_reported_and_the_others_still_warmed(tmp_path: Path) -> None:
    repo = model_repository(tmp_path, "add_sub")
    report_file = tmp_path / "warm.prom"
    with (
        local_pool(repo, max_instances=2, idle_ttl_s=60) as (url, _),
        misbehaving("hang") as hang,
        misbehaving("5xx") as five,
        misbehaving("body") as body,
    ):
        # The good target's two instances started beforehand, with all the time a real Triton
        # sidecar takes to start: the run below is about the faulty ones (cold starts through
        # pings are test_overlapping_pings_reach_distinct_real_instances_and_keep_them_warm's).
        good = {"name": "good", "kind": "http", "url": url, "signing_key_env": None}
        transport = HttpTransport(Target.model_validate(good), pooled_session())
        payload = schedules.ping_payload(WarmTarget(dwell_ms=800))
        started = warm_target("good", transport, 2, payload, models=[], probe=False, waves=5, timeout_s=60)
        assert started.ok, started
        targets = [
            good,
            {"name": "hangs", "kind": "http", "url": hang, "signing_key_env": None},
            {"name": "fails", "kind": "http", "url": five, "signing_key_env": None},
            {"name": "wrong", "kind": "http", "url": body, "signing_key_env": None},
            {
                "name": "nocreds",
                "kind": "aliyun_fc",
                "mode": "invoke",
                "service_name": "s",
                "function_name": "f",
                "region": "cn-hangzhou",
            },
        ]
        config = {
            "targets": targets,
            "warmup": {
                "targets": {t["name"]: {"instances": 2, "dwell_ms": 800} for t in targets},
                "waves": 2,
                "ping_timeout_s": 5,
                "report_file": str(report_file),
            },
        }
        code, events, stderr = run_cli(config, tmp_path)
    by_target = {e["target"]: e for e in events if e["event"] == "target"}
    assert code == 1 and "fewer warm instances than wanted" in stderr
    assert by_target["good"]["ok"] and by_target["good"]["warm"] == 2
    assert (
        "timed out" in by_target["hangs"]["errors"][0].lower()
        or "timeout" in by_target["hangs"]["errors"][0].lower()
    )
    assert "503" in by_target["fails"]["errors"][0]
    assert (
        "not a warm-up report" in by_target["wrong"]["errors"][0]
        or "other than a warm-up report" in by_target["wrong"]["errors"][0]
    )
    assert "credentials" in by_target["nocreds"]["errors"][0]
    assert len(read_warm_report(report_file.read_text())["good"]) == 2


def test_an_invalid_config_is_refused_with_the_path_of_the_bad_field(tmp_path: Path) -> None:
    code, _, stderr = run_cli(
        {
            "targets": [{"name": "t", "kind": "http", "url": "http://x"}],
            "warmup": {"targets": {"t": {"dwell_ms": -1}}},
        },
        tmp_path,
    )
    assert code == 2 and "warmup.targets.t.dwell_ms" in stderr


@pytest.mark.integration
def test_fc_timer_and_eventbridge_payloads_are_accepted_by_the_real_adapters(tmp_path: Path) -> None:
    from testing.function import invoke, lambda_emulator

    repo = model_repository(tmp_path, "add_sub")
    timer = {**load_event("fc_timer.json"), "payload": schedules.fc_timer_trigger(SPEC, 240)["payload"]}
    with local_pool(repo, max_instances=1) as (url, _):
        status, _, raw = http("POST", url + "/invoke", json.dumps(timer).encode())
        assert status == 200 and json.loads(raw)["triton_ready"] is True
    with lambda_emulator(repo, tmp_path) as rie:
        report = invoke(rie, json.loads(schedules.eventbridge_schedule(SPEC, 240)["input"]))
        assert report["triton_ready"] is True and report["models_ready"] == ["add_sub"]
