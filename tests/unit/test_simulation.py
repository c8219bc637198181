"""The simulator: deterministic for a seed, residency kept by every policy, the model behaving as
the platforms do, traces read or refused with a clear error, and the command's JSON as promised."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gateway_plugin.config import SpillwayConfig, load
from gateway_plugin.simulation.billing import Bill
from gateway_plugin.simulation.cloud import CloudTarget
from gateway_plugin.simulation.cluster import HISTORY, Cluster, Job
from gateway_plugin.simulation.command import run_policies
from gateway_plugin.simulation.settings import SimulatedCluster, SimulatedTarget
from gateway_plugin.simulation.trace import RateTrace, Shaping, TraceError, arrivals, generate
from gateway_plugin.simulation.trace import load as load_trace
from testing.paths import ROOT

BURSTY = load(ROOT / "examples" / "simulation" / "bursty.yaml")
SHORT = generate("mmpp", {"base": 40, "burst": 110, "on_s": 20, "off_s": 40, "seconds": 240})
POLICY_NAMES = {"spillway", "all_local", "all_cloud", "static_threshold", "least_busy", "perfect", "oracle"}


def test_the_same_seed_gives_the_same_result_and_another_seed_another() -> None:
    shaping = Shaping(confidential_share=0.2)
    first = {n: m.summary() for n, m in run_policies(BURSTY, SHORT, shaping, 7).items()}
    again = {n: m.summary() for n, m in run_policies(BURSTY, SHORT, shaping, 7).items()}
    other = {n: m.summary() for n, m in run_policies(BURSTY, SHORT, shaping, 8).items()}
    assert first == again
    assert first != other


def test_every_policy_meets_the_same_requests_and_keeps_residency() -> None:
    runs = run_policies(BURSTY, SHORT, Shaping(confidential_share=0.5), 3)
    assert set(runs) == POLICY_NAMES
    counts = {m.summary()["requests"] for m in runs.values()}
    assert len(counts) == 1 and counts.pop() > 10_000
    for name, measures in runs.items():
        assert measures.residency_breaches == 0, name
    assert runs["all_local"].summary()["cloud_share"] == 0
    assert runs["all_cloud"].summary()["cloud_share"] > 0.4


def test_the_bursts_overload_the_cluster_and_spilling_restores_the_slo() -> None:
    runs = {n: m.summary() for n, m in run_policies(BURSTY, SHORT, Shaping(), 1).items()}
    assert runs["all_local"]["slo_attainment"] < 0.9
    assert runs["spillway"]["slo_attainment"] > runs["all_local"]["slo_attainment"] + 0.05
    assert 0 < runs["spillway"]["cloud_share"] < runs["all_cloud"]["cloud_share"]


def test_requests_too_big_for_lambda_go_to_fc_in_the_simulation_too() -> None:
    sized = BURSTY.model_copy(
        update={
            "simulation": BURSTY.simulation.model_copy(update={"large_share": 1.0, "large_bytes": 5 << 20})
        }
    )
    runs = run_policies(sized, SHORT, Shaping(large_share=1.0, large_bytes=5 << 20), 1)
    assert runs["spillway"].cost_by_target.get("aws", 0.0) == pytest.approx(
        runs["all_local"].cost_by_target.get("aws", 0.0)
    ), "only warm-up pings may reach Lambda"
    assert runs["spillway"].summary()["cloud_share"] > 0


def test_every_policys_bill_adds_up_with_the_warmup_counted_once() -> None:
    """The cloud bill holds the warm-up's pings; the total is the cluster plus that bill, and the
    cost per 1,000 requests is that total over what was served."""
    runs = run_policies(BURSTY, SHORT, Shaping(confidential_share=0.2), 5)
    for name, measures in runs.items():
        figures = measures.summary()
        served = figures["requests"] - figures["shed"] - figures["failed"]
        assert figures["warmup_cost_usd"] > 0, name
        assert figures["routed_cost_usd"] + figures["warmup_cost_usd"] == pytest.approx(
            figures["cloud_cost_usd"], abs=2e-6
        ), name
        assert figures["onprem_cost_usd"] + figures["cloud_cost_usd"] == pytest.approx(
            figures["total_cost_usd"], abs=2e-6
        ), name
        # Each figure is rounded to 6 decimals: the per-1,000 one's rounding grows with the count.
        assert figures["usd_per_1000_requests"] * served / 1000 == pytest.approx(
            figures["total_cost_usd"], abs=(served / 1000 + 1) * 1e-6
        ), name
    local = runs["all_local"].summary()
    assert local["cloud_cost_usd"] == pytest.approx(local["warmup_cost_usd"], abs=2e-6)
    assert local["routed_cost_usd"] == pytest.approx(0.0, abs=2e-6)


def test_warmup_pings_are_not_billed_for_prompts() -> None:
    """A ping carries no prompt: pricing prompt tokens leaves the warm-up's part of the bill as it
    was (the warm-up's own price, costs.warm_ping_cost_usd, has no tokens either)."""
    data = BURSTY.model_dump()
    for target in data["targets"]:
        target["cost"] |= {"usd_per_input_token": 0.001, "expected_input_tokens": 500}
    priced = SpillwayConfig.model_validate(data)
    plain = run_policies(BURSTY, SHORT, Shaping(), 5)["all_local"].summary()
    prompts = run_policies(priced, SHORT, Shaping(), 5)["all_local"].summary()
    assert plain["warmup_cost_usd"] > 0
    assert prompts["warmup_cost_usd"] == pytest.approx(plain["warmup_cost_usd"])


def _cluster(servers: int, max_batch: int = 1) -> Cluster:
    return Cluster(servers, SimulatedCluster(max_batch=max_batch, batch_growth=0.5))


def test_the_cluster_queues_fifo_and_counts_as_triton_does() -> None:
    cluster = _cluster(1)
    first = cluster.arrive(Job(0.0, 0, False, 100.0, 0.0), 0.0)
    assert first is not None and first[0] == pytest.approx(0.1)
    assert cluster.arrive(Job(0.01, 0, False, 100.0, 0.0), 0.01) is None
    assert cluster.wait_if_sent(0.02) == pytest.approx(0.18)
    second = cluster.finish(first[1], 0.1)
    assert second is not None and second[0] == pytest.approx(0.2)
    counters = cluster.counters()
    assert (counters.success - HISTORY, counters.pending) == (1, 0)
    cluster.finish(second[1], 0.2)
    assert cluster.counters().queue_us == pytest.approx(90_000)
    # What it served before the trace began: the runner's first scrape reads its service time.
    assert counters.compute_us - 100_000 == pytest.approx(HISTORY * SimulatedCluster().service_ms * 1000)


def test_the_dynamic_batcher_takes_what_is_queued_up_to_its_limit() -> None:
    cluster = _cluster(1, max_batch=4)
    first = cluster.arrive(Job(0.0, 0, False, 100.0, 0.0), 0.0)
    assert first is not None
    for i in range(6):
        cluster.arrive(Job(0.01, 0, False, 100.0, 0.0), 0.01 + i / 1000)
    batch = cluster.finish(first[1], 0.1)
    assert batch is not None and len(batch[1]) == 4
    assert batch[0] == pytest.approx(0.1 + 0.1 * (1 + 0.5 * 3))


def _lambda(**model: float) -> tuple[CloudTarget, Bill]:
    config = SpillwayConfig.model_validate(
        {"targets": [{"name": "aws", "kind": "aws_lambda", "url": "https://x", "idle_ttl_s": 60}]}
    )
    bill = Bill({"aws": config.targets[0].cost})
    settings = SimulatedTarget(cold_start_ms=1000, cold_start_cv=0, network_ms=0, **model)
    return CloudTarget(config.targets[0], settings, bill, random.Random(1)), bill


def test_an_instance_is_cold_once_reused_while_warm_and_reaped_when_idle() -> None:
    cloud, bill = _lambda()
    first = cloud.dispatch(0.0, 100.0)
    assert first.cold and first.done_at == pytest.approx(1.1)
    assert cloud.dispatch(0.5, 100.0).cold, "Lambda runs one request per instance"
    assert first.instance is not None
    cloud.release(first.instance, 1.1)
    assert not cloud.dispatch(2.0, 100.0).cold
    assert cloud.idle_warm(100.0) == 0 and cloud.live == 2
    # 4 GB x 1.1 s billed (init included) + 0.1 s, per the default cost model.
    assert bill.by_target["aws"] > 0


def test_the_platform_limit_throttles_past_its_instances() -> None:
    cloud, _ = _lambda(max_instances=1)
    assert cloud.dispatch(0.0, 100.0).ok
    assert not cloud.dispatch(0.0, 100.0).ok


def test_rate_traces_give_poisson_arrivals_at_their_rate(tmp_path: Path) -> None:
    path = tmp_path / "rates.txt"
    path.write_text("# requests/s per second\n100\n0\n300\n")
    trace = load_trace(str(path))
    assert isinstance(trace, RateTrace) and trace.rates == (100, 0, 300)
    got = list(arrivals(trace, Shaping(scale=2.0), random.Random(1)))
    assert 700 < len(got) < 900
    assert not [a for a in got if 1 <= a.at_s < 2]


def test_csv_traces_carry_sizes_and_classes(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    path.write_text("timestamp,bytes,classification\n100.0,10,public\n100.5,7000000,confidential\n")
    got = list(arrivals(load_trace(str(path)), Shaping(), random.Random(1)))
    assert [(a.at_s, a.body_bytes, a.confidential) for a in got] == [(0.0, 10, False), (0.5, 7000000, True)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10\nlots\n", "rates.txt:2"),
        ("", "no rates"),
        ("-3\n", "rates.txt:1"),
        ("timestamp\n5\n3\n", "go back"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rates.txt"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        list(arrivals(load_trace(str(path)), Shaping(), random.Random(1)))


def test_an_unknown_trace_names_the_generators() -> None:
    with pytest.raises(TraceError, match="poisson, mmpp, diurnal"):
        load_trace("/nonexistent/trace")
    with pytest.raises(TraceError, match="key=number"):
        load_trace("mmpp:burst=lots")


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "simulate", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_command_prints_the_promised_json_on_the_example_config(tmp_path: Path) -> None:
    done = _simulate(
        "--config", "examples/spillway.yaml", "--trace", "diurnal:mean=30,seconds=120",
        "--confidential-share", "0.2", "--json", "--report", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result["policies"]) == POLICY_NAMES and result["requests"] > 1000
    keys = {"slo_attainment", "p50_ms", "p99_ms", "cloud_share", "cloud_cost_usd", "cold_hits"}
    assert all(keys | {"flaps_per_min", "shed"} <= set(p) for p in result["policies"].values())
    report = (tmp_path / "report.html").read_text()
    assert report.startswith("<!doctype html>") and 'id="chart-latency"' in report


def test_sheddable_requests_that_cannot_leave_are_refused_rather_than_queued_past_the_target() -> None:
    """Half the requests may not leave and the bursts overfill the cluster with them: the ones that
    say they are sheddable are answered 503 at once, so the ones behind them meet the target."""
    trace = generate("mmpp", {"base": 20, "burst": 120, "on_s": 30, "off_s": 60, "seconds": 240})
    example = load(ROOT / "examples" / "spillway.yaml")
    critical = run_policies(example, trace, Shaping(confidential_share=0.5), 2)["spillway"].summary()
    shaping = Shaping(confidential_share=0.5, sheddable_share=1.0)
    sheddable = run_policies(example, trace, shaping, 2)["spillway"].summary()
    assert sheddable["slo_attainment"] > critical["slo_attainment"] + 0.1, (sheddable, critical)
    assert sheddable["residency_breaches"] == 0
    refused = _simulate("--config", "examples/spillway.yaml", "--trace", "poisson", "--sheddable-share", "2")
    assert refused.returncode != 0 and "--sheddable-share must be between 0 and 1" in refused.stderr


def test_provisioned_instances_are_never_reaped_and_billed_as_the_warm_ups_for_the_whole_run() -> None:
    """Lambda's provisioned concurrency in place of pings: no ping is sent, the instances stay warm
    through the idle gaps that reap pinged ones, and the warm-up's part of the bill is exactly the
    provisioned GB-seconds of the run."""
    data = BURSTY.model_dump()
    aws = next(t for t in data["targets"] if t["name"] == "aws")
    aws |= {"function_name": "infer", "qualifier": "live"}
    aws["cost"]["usd_per_provisioned_gb_second"] = 0.0000041667
    data["warmup"]["targets"]["aws"] = {"instances": 2, "provisioned": True}
    provisioned = SpillwayConfig.model_validate(data)
    trace = generate("sporadic", {"mean": 5, "idle_s": 400, "active_s": 20, "seconds": 1200})
    measures = run_policies(provisioned, trace, Shaping(), 3)["all_cloud"]
    figures = measures.summary()
    expected = 2 * 4.0 * 0.0000041667 * measures.seconds
    assert figures["warmup_cost_usd"] == pytest.approx(expected, rel=1e-4)
    cloud, _ = _lambda()
    cloud.prewarm(2, 0.0, pinned=True)
    cloud.prewarm(1, 0.0)
    assert cloud.idle_warm(10_000.0) == 2 and cloud.live == 2, "the pinged one is reaped, not the pinned"
    assert not cloud.dispatch(10_000.0, 100.0).cold


def test_a_sweep_runs_each_value_and_a_bad_one_is_named() -> None:
    done = _simulate(
        "--config", "examples/simulation/bursty.yaml", "--trace", "poisson:rate=60,seconds=60",
        "--sweep", "targets.aws.concurrency_cap=1,5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    points = json.loads(done.stdout)["sweep"]["points"]
    assert [p["value"] for p in points] == [1, 5]
    bad = _simulate("--config", "examples/spillway.yaml", "--trace", "mmpp", "--sweep", "local.nothing=1")
    assert bad.returncode == 2 and "local.nothing names no setting" in bad.stderr
    bad = _simulate("--config", "examples/spillway.yaml", "--trace", "mmpp", "--sweep", "local.parallelism=0")
    assert bad.returncode == 2 and "local.parallelism" in bad.stderr


def _with(config: SpillwayConfig, **sections: dict[str, object]) -> SpillwayConfig:
    data = config.model_dump()
    for key, value in sections.items():
        data[key] = {**data[key], **value}
    return SpillwayConfig.model_validate(data)


def test_a_failing_target_trips_the_runners_breaker_and_the_chain_moves_on() -> None:
    """The function fails every request: the breaker the runner keeps opens, so only probes reach
    it, and the overflow goes to the next target."""
    broken = _with(BURSTY, simulation={"targets": {"aws": {"error_rate": 1.0}}})
    runs = run_policies(broken, SHORT, Shaping(), 1)
    spillway = runs["spillway"].summary()
    assert spillway["failed"] > 0
    assert spillway["failed"] < 0.1 * runs["all_cloud"].summary()["failed"]
    assert runs["spillway"].cost_by_target["aliyun"] > 0


def test_a_target_budget_caps_what_the_policy_spends_there() -> None:
    capped = _with(BURSTY, budgets={"per_target_hourly_usd": {"aws": 0.002, "aliyun": 0.0}})
    spillway = run_policies(capped, SHORT, Shaping(), 1)["spillway"]
    warmup = run_policies(capped, SHORT, Shaping(), 1)["all_local"].cost_by_target["aws"]
    # The budget counts the policy's estimate per request; the bill adds billed init and pings.
    assert spillway.cost_by_target["aws"] - warmup < 0.004
    assert spillway.summary()["cloud_share"] > 0


def test_tenant_quotas_apply_to_the_tenants_a_csv_trace_names(tmp_path: Path) -> None:
    path = tmp_path / "tenants.csv"
    rows = [f"{i * 0.1:.1f},{'small' if i % 2 else 'big'}" for i in range(600)]
    path.write_text("timestamp,tenant\n" + "\n".join(rows) + "\n")
    quota = _with(BURSTY, tenants={"quotas": {"small": {"requests_per_minute": 60}}})
    runs = run_policies(quota, load_trace(str(path)), Shaping(), 1)
    assert runs["spillway"].summary()["shed"] == 300 - 60
    assert runs["all_local"].summary()["shed"] == 0
