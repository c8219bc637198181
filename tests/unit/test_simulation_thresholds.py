"""``local.thresholds`` under simulation: GPU utilisation is modelled as the cluster's busy share of
its parallelism and makes Spillway spill sooner; GPU memory (and any other gauge) is not in the
cluster model, never crosses, and ``simulate`` says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway_plugin.config import SpillwayConfig, load
from gateway_plugin.simulation.engine import simulate
from gateway_plugin.simulation.runner_policy import SpillwayRouter
from gateway_plugin.simulation.trace import Shaping, generate
from testing.paths import ROOT

BURSTY = load(ROOT / "examples" / "simulation" / "bursty.yaml")
SHORT = generate("mmpp", {"base": 40, "burst": 110, "on_s": 20, "off_s": 40, "seconds": 240})


def _with(thresholds: dict[str, Any]) -> SpillwayConfig:
    data = BURSTY.model_dump(mode="json", exclude_none=True)
    data["local"]["thresholds"] = thresholds
    return SpillwayConfig.model_validate(data)


def _cloud_share(config: SpillwayConfig) -> float:
    measures = simulate(config, SpillwayRouter(config), SHORT, Shaping(), 1)
    return float(measures.summary()["cloud_share"])


def test_a_gpu_utilisation_limit_spills_sooner_and_an_unmodelled_gauge_changes_nothing() -> None:
    alone = _cloud_share(BURSTY)
    assert 0 < alone < 1
    assert _cloud_share(_with({"gpu_utilization": 0.3})) > alone + 0.05, "busy past 30%: spill sooner"
    assert _cloud_share(_with({"gpu_utilization": 1.0})) == alone, "a share never exceeds 1"
    assert _cloud_share(_with({"gpu_memory": 0.0})) == alone, "GPU memory is not modelled: never crossed"


def test_simulate_says_which_thresholds_it_models(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "examples" / "simulation" / "bursty.yaml").read_text())
    data["load_aware"] = {"threshold_gpu_mem": 0.9, "threshold_cpu": 0.8}
    data.setdefault("local", {})["thresholds"] = {"gpu_utilization": 0.95}
    path = tmp_path / "spillway.yaml"
    path.write_text(yaml.safe_dump(data))
    command = [sys.executable, "-m", "gateway_plugin", "simulate", "--config", str(path)]
    done = subprocess.run(
        [*command, "--trace", "poisson:rate=30,seconds=30", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)["thresholds"]
    assert said == {"modelled": ["gpu_utilization"], "not_modelled": ["gpu_memory", "nv_cpu_utilization"]}
