"""``local.thresholds``: gauges past their limit make the cluster overflow, with the latency's
hysteresis; read from Triton's metrics text (a real CPU-only Triton for ``nv_cpu_utilization``, a
loopback page in Triton's format for the GPU gauges); the seed design's ``load_aware`` keys."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from functions.sidecar import Sidecar, SidecarOptions, free_port
from gateway_plugin.app import http_fetcher
from gateway_plugin.config import ConfigError, SpillwayConfig, parse
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.gauges import compiled
from gateway_plugin.policy.model import LOCAL, Reason
from gateway_plugin.policy.overflow import gauges_hot
from gateway_plugin.policy.snapshot import LocalLoad, RequestFeatures, Snapshot
from gateway_plugin.signals.load import LoadTracker
from gateway_plugin.signals.members import Counters
from gateway_plugin.signals.scraper import Scraper
from gateway_plugin.simulation.runner_policy import _SimulatedState
from testing.http import QuietHandler, http_server_thread, wait_until
from testing.paths import TEST_MODELS

CONFIG: dict[str, Any] = {
    "local": {"latency_target_ms": 100, "thresholds": {"gpu_memory": 0.9, "gpu_utilization": 0.95}},
    "overflow": {"enter_ratio": 1.0, "exit_ratio": 0.8, "onprem_headroom": 0.0},
    "targets": [{"name": "aws", "kind": "aws_lambda", "url": "https://a.example", "cold_start_ms": 0}],
}
POLICY = build_policy(SpillwayConfig.model_validate(CONFIG))
# 20 ms of latency against a 100 ms target: the latency alone keeps everything home.
QUIET = LocalLoad(fresh=True, queue_ms=10, compute_ms=10)


def _request(classification: str | None) -> RequestFeatures:
    headers = {} if classification is None else {"x-data-classification": classification}
    return RequestFeatures("/v2/models/m/infer", headers, {}, "m")


def _decide(load: LocalLoad, classification: str | None = "public") -> Any:
    return decide(_request(classification), Snapshot({"m": load}), POLICY)


def _after(*scrapes: tuple[float | None, ...], was: bool = False) -> bool:
    """The thresholds' state after these scrapes' (GPU utilisation, GPU memory)."""
    hot = was
    for gauges in scrapes:
        hot = gauges_hot(gauges, POLICY.thresholds, hot)
    return hot


def test_a_gpu_memory_past_its_limit_spills_public_traffic_on_a_quiet_queue() -> None:
    assert not _after((0.5, 0.5)) and _decide(QUIET).target == LOCAL
    assert _after((0.5, 0.93)), "GPU memory past 0.9"
    assert _after((0.97, 0.5)), "GPU utilisation past 0.95"
    full = _decide(QUIET._replace(gauges_hot=True))
    assert full.target == "aws" and full.reason is Reason.OVERFLOW_COLD


@pytest.mark.parametrize("classification", [None, "secret", "internal"])
def test_on_prem_only_requests_never_leave_whatever_the_gauges(classification: str | None) -> None:
    d = _decide(QUIET._replace(gauges_hot=True, overflowing=True), classification)
    assert d.target == LOCAL and d.on_prem_only and d.residency_kept


def test_the_gauges_hysteresis_is_the_latencys() -> None:
    # gpu_memory: enter above 0.9, leave below 0.9 x 0.8 / 1.0 = 0.72; between, keep.
    assert POLICY.thresholds[1].exit == pytest.approx(0.72)
    assert _after((None, 0.95), (None, 0.8)), "hot, then between the limits: still hot"
    assert not _after((None, 0.5), (None, 0.8)), "never hot, then between: not yet hot"
    assert not _after((None, 0.95), (None, 0.8), (None, 0.7)), "below the exit: settled"
    assert _after((0.2, 0.95), (0.99, 0.5), (0.9, 0.5)), "one gauge between its limits holds it"
    assert _after((None, POLICY.thresholds[1].exit), was=True), "at the exit is not below it"
    assert not _after((None, 0.9), was=False), "at the limit is not past it"


def test_the_thresholds_and_the_latency_keep_their_own_hysteresis() -> None:
    """A gauge between its limits holds only an overflow the gauges started, and a latency between
    its limits only one the latency started: each signal enters and leaves on its own."""
    # Latency 85 ms: between the exit (80) and the enter (100) limits.
    warm_queue = LocalLoad(fresh=True, queue_ms=75, compute_ms=10)
    assert _decide(warm_queue._replace(overflowing=True)).target == "aws"
    assert _decide(warm_queue._replace(overflowing=False)).target == LOCAL
    # Quiet latency and the gauges hot: spill, while the latency's own state stays cool.
    d = _decide(QUIET._replace(gauges_hot=True))
    assert d.target == "aws" and not d.overflowing, "the decision feeds back the latency's state only"
    assert _decide(QUIET._replace(gauges_hot=False, overflowing=True)).target == LOCAL


def test_an_unreported_gauge_neither_starts_nor_holds_overflow_and_stale_signals_stay_home() -> None:
    assert not _after((None, None), was=True) and not _after((), was=True)
    stale = _decide(QUIET._replace(fresh=False, gauges_hot=True))
    assert stale.target == LOCAL and stale.reason is Reason.SIGNALS_MISSING


def test_the_tracker_applies_the_hysteresis_at_each_scrape_and_the_runner_spills_on_it() -> None:
    state = _SimulatedState(SpillwayConfig.model_validate(CONFIG), GatewaySecrets())
    assert state.load.thresholds == POLICY.thresholds
    for memory, hot in ((0.5, False), (0.95, True), (0.8, True), (0.6, False)):
        state.load.observe([{"m": Counters(success=1)}], (0.1, memory))
        assert state.load.snapshot("m")["m"].gauges_hot is hot, memory
        d = decide(_request("public"), state.snapshot(None, "m"), state.policy)
        assert (d.target == "aws") is hot, (memory, d)


GPU_PAGE = """\
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-aaaa"} 0.25
nv_gpu_utilization{gpu_uuid="GPU-bbbb"} 0.75
# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-aaaa"} 8e+10
nv_gpu_memory_total_bytes{gpu_uuid="GPU-bbbb"} 4e+10
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-aaaa"} 4e+10
nv_gpu_memory_used_bytes{gpu_uuid="GPU-bbbb"} 3.8e+10
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} 5
"""
IDLE_GPU_PAGE = GPU_PAGE.replace(" 0.75\n", " 0.05\n").replace(" 3.8e+10\n", " 1e+09\n")


class _Page(QuietHandler):
    """A metrics page in Triton's format: the stand-in for Triton's GPU gauges, which a real
    tritonserver exports only with a GPU (there is none on this machine; it runs on the CPU)."""

    pages: ClassVar[dict[str, str]] = {"/a": GPU_PAGE, "/b": IDLE_GPU_PAGE}

    def do_GET(self) -> None:
        body = self.pages[self.path].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _scrape(thresholds: dict[str, Any], urls: list[str]) -> tuple[float | None, ...]:
    config = parse({"local": {"thresholds": thresholds}})
    specs, _ = compiled(config.thresholds(), 0.8, 0.7)
    tracker = LoadTracker()
    assert asyncio.run(Scraper(tracker, http_fetcher(), urls, 1.0, gauges=lambda: specs).scrape_once())
    return tracker.gauges


def test_gpu_gauges_are_read_per_gpu_then_over_the_endpoints() -> None:
    with http_server_thread(_Page) as base:
        one = _scrape({"gpu_utilization": 0.9, "gpu_memory": 0.9}, [f"{base}/a"])
        # The busiest GPU (0.75); the fullest GPU by share, not by bytes (38 of 40 GB, not 40 of 80).
        assert one == (0.75, pytest.approx(0.95))
        both = [f"{base}/a", f"{base}/b"]
        assert _scrape({"gpu_memory": 0.9}, both) == (pytest.approx(0.95),), "max over endpoints"
        mean = _scrape({"gpu_utilization": {"limit": 0.9, "across": "mean"}}, both)
        assert mean == (pytest.approx(0.5),), "the mean of each endpoint's busiest GPU (0.75, 0.25)"
        gauge = {"metric": "nv_gpu_utilization", "labels": {"gpu_uuid": "GPU-aaaa"}, "limit": 0.5}
        assert _scrape({"gauges": [gauge]}, [f"{base}/a"]) == (0.25,), "the label filter picks one GPU"
        missing = {"metric": "nv_energy_consumption", "limit": 1.0}
        assert _scrape({"gauges": [missing]}, both) == (None,), "no endpoint reports it: absent"


def test_a_real_cpu_only_triton_reports_its_cpu_utilisation_for_threshold_cpu(tmp_path: Path) -> None:
    """The seed's threshold_cpu reads nv_cpu_utilization, which a real tritonserver exports on the
    CPU too (it has no nv_gpu_* without a GPU: those read as absent)."""
    shutil.copytree(TEST_MODELS / "slow", tmp_path / "slow")
    metrics_port = free_port()
    triton = Sidecar(SidecarOptions(tmp_path, ("slow",), 30, metrics_port=metrics_port))
    triton.start()
    try:
        triton.wait_ready(30)
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        config = parse({"load_aware": {"threshold_cpu": 0.8}, "local": {"thresholds": {"gpu_memory": 0.9}}})
        specs, limits = compiled(config.thresholds(), 0.8, 0.7)
        assert [t.name for t in limits] == ["gpu_memory", "nv_cpu_utilization"]
        tracker = LoadTracker()
        scraper = Scraper(tracker, http_fetcher(), [url], 1.0, gauges=lambda: specs)

        def cpu_read() -> bool:
            return asyncio.run(scraper.scrape_once()) and tracker.gauges[1] is not None

        # Triton serves its metrics shortly after it is ready, and samples its CPU on an interval.
        wait_until(cpu_read, 30, "Triton's first nv_cpu_utilization sample")
        memory, cpu = tracker.gauges
        assert memory is None, "no GPU: Triton exports no nv_gpu_memory_*"
        assert cpu is not None and 0.0 <= cpu <= 1.0, tracker.gauges
    finally:
        triton.stop()


def test_an_llm_engines_queue_and_kv_cache_are_read_under_its_backends_names() -> None:
    """The Gateway API Inference Extension's saturation points by default (5 waiting, 80 %)."""
    vllm = compiled(parse({"local": {"thresholds": {"engine": {"backend": "vllm"}}}}).thresholds(), 0.9, 0.8)[
        1
    ]
    assert [(t.name, t.enter) for t in vllm] == [
        ("vllm:num_requests_waiting", 5),
        ("vllm:gpu_cache_usage_perc", 0.8),
    ]
    trt = {
        "backend": "tensorrt_llm",
        "waiting": None,
        "kv_cache": {"limit": 0.9, "exit": 0.6},
        "model": "llm",
    }
    specs, limits = compiled(parse({"local": {"thresholds": {"engine": trt}}}).thresholds(), 0.9, 0.8)
    assert [(s.metric, s.labels) for s in specs] == [
        ("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "fraction"), ("model", "llm")))
    ]
    assert [(t.enter, t.exit) for t in limits] == [(0.9, 0.6)]


def test_a_real_triton_models_vllm_named_kv_cache_gauge_is_read(tmp_path: Path) -> None:
    """The ``tokens`` test model exports vLLM's backend's gauges from the real tritonserver."""
    shutil.copytree(TEST_MODELS / "tokens", tmp_path / "tokens")
    (tmp_path / "tokens" / "kv_cache").write_text("0.93")
    metrics_port = free_port()
    triton = Sidecar(SidecarOptions(tmp_path, ("tokens",), 30, metrics_port=metrics_port))
    triton.start()
    try:
        triton.wait_ready(30)
        config = parse({"local": {"thresholds": {"engine": {"backend": "vllm", "model": "tokens"}}}})
        specs, _ = compiled(config.thresholds(), 0.8, 0.7)
        tracker = LoadTracker()
        scraper = Scraper(
            tracker, http_fetcher(), [f"http://127.0.0.1:{metrics_port}/metrics"], 1.0, gauges=lambda: specs
        )
        wait_until(
            lambda: asyncio.run(scraper.scrape_once()) and tracker.gauges[1] is not None, 30, "a sample"
        )
        assert tracker.gauges == (0.0, pytest.approx(0.93))
    finally:
        triton.stop()


def test_the_seed_keys_map_onto_thresholds_and_check_config_says_to_what(tmp_path: Path) -> None:
    config = parse({"load_aware": {"threshold_cpu": 0.8, "threshold_gpu_mem": 0.9}})
    merged = config.thresholds()
    assert merged.gpu_memory is not None and merged.gpu_memory.limit == 0.9
    assert [(g.metric, g.limit) for g in merged.gauges] == [("nv_cpu_utilization", 0.8)]
    path = tmp_path / "spillway.yaml"
    path.write_text("load_aware:\n  threshold_cpu: 0.8\n  threshold_gpu_mem: 0.9\n")
    out = subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "load_aware.threshold_gpu_mem 0.9 is local.thresholds.gpu_memory" in out, out
    assert "load_aware.threshold_cpu 0.8 is local.thresholds.gauges [{metric: nv_cpu_utilization" in out
    assert "not the gateway's own CPU" in out


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (
            {"load_aware": {"threshold_gpu_mem": 0.9}, "local": {"thresholds": {"gpu_memory": 0.8}}},
            "both set the GPU memory limit",
        ),
        (
            {
                "load_aware": {"threshold_cpu": 0.9},
                "local": {"thresholds": {"gauges": [{"metric": "nv_cpu_utilization", "limit": 0.5}]}},
            },
            "both set the CPU limit",
        ),
        ({"local": {"thresholds": {"gpu_memory": {"limit": 0.8, "exit": 0.9}}}}, "must not exceed limit"),
        ({"local": {"thresholds": {"gpu_memory": 1.5}}}, "less than or equal to 1"),
        ({"load_aware": {"threshold_gpu": 0.5}}, "threshold_gpu"),
        ({"local": {"thresholds": {"gauges": [{"metric": "bad name", "limit": 1}]}}}, "metric"),
        (
            {
                "local": {
                    "thresholds": {
                        "engine": {"backend": "vllm"},
                        "gauges": [{"metric": "vllm:gpu_cache_usage_perc", "limit": 0.5}],
                    }
                }
            },
            "both read vllm:gpu_cache_usage_perc",
        ),
        ({"local": {"thresholds": {"engine": {"backend": "sglang"}}}}, "backend"),
        ({"local": {"thresholds": {"engine": {"backend": "vllm", "kv_cache": 80}}}}, "kv_cache"),
    ],
)
def test_conflicting_or_bad_thresholds_are_refused_naming_the_field(data: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse(data)


def test_a_reload_that_changes_the_thresholds_forgets_what_was_read_for_the_old_ones() -> None:
    state = _SimulatedState(SpillwayConfig.model_validate(CONFIG), GatewaySecrets())
    state.load.observe([{"m": Counters(success=1)}], (0.1, 0.95))
    assert state.load.gauges_hot
    state.apply(SpillwayConfig.model_validate(CONFIG), GatewaySecrets())
    assert state.load.gauges_hot, "the same thresholds: the state holds"
    only_cpu = {
        **CONFIG,
        "local": {**CONFIG["local"], "thresholds": {}},
        "load_aware": {"threshold_cpu": 0.5},
    }
    state.apply(SpillwayConfig.model_validate(only_cpu), GatewaySecrets())
    assert not state.load.gauges_hot and state.load.gauges == ()
    assert [t.name for t in state.load.thresholds] == ["nv_cpu_utilization"]
    state.load.observe([{"m": Counters(success=2)}], (0.6,))
    assert state.load.gauges_hot
