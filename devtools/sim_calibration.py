"""The simulator's calibration against the demo: the same trace through the real local stack
(real Triton, runner, the development gateway or a real APISIX, function pools) and through the
simulator.

    python -m devtools.sim_calibration [OUT_DIR]     # prints the real and simulated figures (JSON)

Only the unloaded floor is taken from the real run: the cluster's service time and the gateway's
own overhead, from the fastest tenth of the requests answered on premises (those that did not
queue). Everything under load, the queueing, spilling and the tail, is the simulator's prediction,
made as the demo's route decides: the runner's own books (``simulation.gateway_counts`` false).
The figures are taken over every request and over the on-prem-only ones alone (their p99 and the
share answered within the latency target): the headroom the policy keeps for them shows there.
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path
from typing import Any

import yaml

from devtools.demo_report import FEEDBACK_S
from gateway_plugin.config import SpillwayConfig, parse
from gateway_plugin.simulation.engine import jobs, replay
from gateway_plugin.simulation.results import SHED_KIND
from gateway_plugin.simulation.runner_policy import SpillwayRouter
from gateway_plugin.simulation.trace import CsvTrace, Shaping

FLOOR_SHARE = 0.1


def _floor(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(FLOOR_SHARE * (len(ordered) - 1))]


def _went_out(sample: dict[str, Any]) -> bool:
    return sample["target"] not in ("local", "shed", "unknown", "")


def _p99(latencies_ms: list[float]) -> float:
    ordered = sorted(latencies_ms)
    return ordered[max(0, -(-99 * len(ordered) // 100) - 1)] if ordered else 0.0


def real_figures(samples: list[dict[str, Any]], target_ms: float) -> dict[str, float]:
    """p99 (ms) and cloud share of what the load generator saw, how many on-prem-only requests
    went out (none may), and their own p99 and share answered within ``target_ms``."""
    answered = [s for s in samples if s["status"] == 200]
    stayed = [s for s in samples if s["sensitive"]]
    in_time = [s for s in stayed if s["status"] == 200 and s["latency_s"] * 1000 <= target_ms]
    return {
        "p99_ms": _p99([s["latency_s"] * 1000 for s in answered]),
        "cloud_share": sum(1 for s in samples if _went_out(s)) / len(samples),
        "residency_breaches": sum(1 for s in samples if s["sensitive"] and _went_out(s)),
        "onprem_p99_ms": _p99([s["latency_s"] * 1000 for s in stayed if s["status"] == 200]),
        "onprem_slo": len(in_time) / len(stayed) if stayed else 1.0,
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
        "gateway_counts": False,
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


def _simulated_once(config: SpillwayConfig, trace: CsvTrace, seed: int) -> dict[str, float]:
    arrivals = list(jobs(config, trace, Shaping(), seed))
    measures = replay(config, SpillwayRouter(config), arrivals, seed)
    figures = measures.summary()
    # The engine records each request when it is answered: its arrival time names it.
    stays = {job.at for job in arrivals if job.confidential}
    mine = [
        (ms, kind)
        for at, ms, kind in zip(measures.at, measures.latency_ms, measures.kinds, strict=True)
        if at in stays
    ]
    target = measures.latency_target_ms
    return {
        **figures,
        "onprem_p99_ms": _p99([ms for ms, kind in mine if kind != SHED_KIND]),
        "onprem_slo": sum(1 for ms, kind in mine if kind != SHED_KIND and ms <= target) / len(mine)
        if mine
        else 1.0,
    }


def simulated(config: SpillwayConfig, trace: CsvTrace, seeds: int = 5) -> dict[str, float]:
    """Spillway's simulated figures, each the median over ``seeds`` seeds (the trace is the real
    one; the seeds vary service and start times); the requests replayed and the on-prem-only
    ones sent out, the most of any seed."""
    runs = [_simulated_once(config, trace, seed) for seed in range(seeds)]
    keys = ("p99_ms", "cloud_share", "onprem_p99_ms", "onprem_slo")
    medians = {key: statistics.median(r[key] for r in runs) for key in keys}
    return {**medians, **{key: max(r[key] for r in runs) for key in ("requests", "residency_breaches")}}


def calibrate(out_dir: Path, gateway: str = "dev", onprem_headroom: float | None = None) -> dict[str, Any]:
    """The demo's short bursty load through the real stack, then the same requests simulated.
    ``onprem_headroom``: the policy's (its default when None)."""
    from devtools import demo

    settings = demo.DemoSettings(
        out_dir=out_dir / "demo",
        gateway="apisix" if gateway == "apisix" else "dev",
        steady_s=6,
        burst_s=12,
        cooldown_s=6,
    )
    if onprem_headroom is not None:
        settings = dataclasses.replace(settings, onprem_headroom=onprem_headroom)
    result = demo.run(settings)
    samples = result["samples"]
    config = simulation_config(result, settings.out_dir)
    cluster = config.simulation.cluster
    return {
        "requests": len(samples),
        "errors": sum(1 for s in samples if s["status"] != 200),
        "local_delay_ms": settings.local_delay_ms,
        "floor": {"service_ms": cluster.service_ms, "network_ms": cluster.network_ms},
        "gateway": result["gateway"]["name"],
        "onprem_headroom": config.overflow.onprem_headroom,
        "real": real_figures(samples, config.local.latency_target_ms),
        "simulated": simulated(config, trace_file(samples, out_dir / "trace.csv")),
    }


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    print(json.dumps(calibrate(Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))))
