"""``simulate --calibrate`` against a real Triton: the service time it measures, and its errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from functions.sidecar import Sidecar, SidecarOptions, free_port
from testing.paths import ROOT

DELAY_MS = 40
BODY = {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "FP32", "data": [DELAY_MS]}]}


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    repo = tmp_path_factory.mktemp("models")
    shutil.copytree(ROOT / "tests" / "model_repository" / "slow", repo / "slow")
    metrics_port = free_port()
    server = Sidecar(SidecarOptions(repo, ("slow",), 30, metrics_port=metrics_port, log_prefix="[triton] "))
    server.start()
    try:
        server.wait_ready(60)
        yield f"http://127.0.0.1:{server.http_port}", f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        server.stop()


def _calibrate(tmp_path: Path, urls: tuple[str, str], model: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "spillway.yaml"
    local = {"endpoints": [{"url": urls[0], "metrics_url": urls[1]}]}
    config.write_text(yaml.safe_dump({"local": local, "simulation": {"model": model}}))
    body = tmp_path / "request.json"
    body.write_text(json.dumps(BODY))
    return subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "simulate", "--config", str(config), "--calibrate",
         "--body", str(body), "--requests", "20"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_calibration_measures_the_models_service_time_and_the_http_overhead(
    tmp_path: Path, triton: tuple[str, str]
) -> None:
    done = _calibrate(tmp_path, triton, "slow")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["requests"] == 20
    assert found["service_ms"] >= DELAY_MS, "the model sleeps that long per request"
    assert found["network_ms"] >= 0 and found["service_cv"] >= 0
    assert found["client_p99_ms"] >= found["service_ms"], "the client also waits for HTTP"


def test_calibration_names_what_triton_refused(tmp_path: Path, triton: tuple[str, str]) -> None:
    done = _calibrate(tmp_path, triton, "no_such_model")
    assert done.returncode == 1
    assert "Triton answered 4" in done.stderr and "check --model and --body" in done.stderr
