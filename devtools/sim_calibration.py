"""The simulator's calibration against the demo: the same trace through the real local stack
(real Triton, runner, development gateway, function pools) and through the simulator.

    python -m devtools.sim_calibration [OUT_DIR]     # prints the real and simulated figures (JSON)

Only the unloaded floor is taken from the real run: the cluster's service time and the gateway's
own overhead, from the fastest tenth of the requests answered on premises (those that did not
queue). Everything under load, the queueing, spilling and the tail, is the simulator's prediction.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any

import yaml

from devtools.demo_report import FEEDBACK_S
from gateway_plugin.config import SpillwayConfig, parse
from gateway_plugin.simulation.command import run_policies
from gateway_plugin.simulation.trace import CsvTrace, Shaping

FLOOR_SHARE = 0.1


def _floor(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(FLOOR_SHARE * (len(ordered) - 1))]


def _went_out(sample: dict[str, Any]) -> bool:
    return sample["target"] not in ("local", "shed", "unknown", "")


def real_figures(samples: list[dict[str, Any]]) -> dict[str, float]:
    """p99 (ms) and cloud share of what the load generator saw, and how many on-prem-only
    requests went out (none may)."""
    latencies = sorted(s["latency_s"] * 1000 for s in samples if s["status"] == 200)
    return {
        "p99_ms": latencies[max(0, -(-99 * len(latencies) // 100) - 1)],
        "cloud_share": sum(1 for s in samples if _went_out(s)) / len(samples),
        "residency_breaches": sum(1 for s in samples if s["sensitive"] and _went_out(s)),
    }


def trace_file(samples: list[dict[str, Any]], path: Path) -> CsvTrace:
    """The requests the demo sent, as a CSV trace: when, and whether they may leave."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["timestamp", "classification"])
        for s in sorted(samples, key=lambda s: s["sent_at"]):
            writer.writerow([f"{s['sent_at']:.6f}", "confidential" if s["sensitive"] else "public"])
    return CsvTrace(path)


def simulation_config(result: dict[str, Any], out_dir: Path) -> SpillwayConfig:
    """The demo's spillway.yaml, with what the simulator assumes of its cluster and function pools."""
    data = yaml.safe_load((out_dir / "spillway.yaml").read_text())
    data.pop("devgateway", None)
    settings = result["settings"]
    local = [s for s in result["samples"] if s["target"] == "local" and s["upstream_ms"]]
    service_ms = _floor([s["upstream_ms"] for s in local])
    overhead_ms = max(0.0, _floor([s["latency_s"] * 1000 - s["upstream_ms"] for s in local]))
    data["simulation"] = {
        "model": "add_sub",
        "cluster": {"service_ms": service_ms, "service_cv": 0.02, "network_ms": overhead_ms},
        "outcome_lag_s": FEEDBACK_S[result["gateway"]["name"]],
        "targets": {
            target["name"]: {
                "service_ms": service_ms,
                "service_cv": 0.02,
                "network_ms": 2 * overhead_ms,
                "max_instances": settings["pool_max"],
            }
            for target in data["targets"]
        },
    }
    return parse(data, "the demo's config")


def simulated(config: SpillwayConfig, trace: CsvTrace, seeds: int = 5) -> dict[str, float]:
    """Spillway's simulated p99 and cloud share, each the median over ``seeds`` seeds (the trace
    is the real one; the seeds vary service and start times); the requests replayed and the
    on-prem-only ones sent out, the most of any seed."""
    runs = [run_policies(config, trace, Shaping(), seed)["spillway"].summary() for seed in range(seeds)]
    medians = {key: statistics.median(r[key] for r in runs) for key in ("p99_ms", "cloud_share")}
    return {**medians, **{key: max(r[key] for r in runs) for key in ("requests", "residency_breaches")}}


def calibrate(out_dir: Path) -> dict[str, Any]:
    """The demo's short bursty load through the real stack, then the same requests simulated."""
    from devtools import demo

    settings = demo.DemoSettings(
        out_dir=out_dir / "demo", gateway="dev", steady_s=6, burst_s=12, cooldown_s=6
    )
    result = demo.run(settings)
    samples = result["samples"]
    config = simulation_config(result, settings.out_dir)
    cluster = config.simulation.cluster
    return {
        "requests": len(samples),
        "errors": sum(1 for s in samples if s["status"] != 200),
        "local_delay_ms": settings.local_delay_ms,
        "floor": {"service_ms": cluster.service_ms, "network_ms": cluster.network_ms},
        "real": real_figures(samples),
        "simulated": simulated(config, trace_file(samples, out_dir / "trace.csv")),
    }


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    print(json.dumps(calibrate(Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))))
