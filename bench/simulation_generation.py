"""Streamed LLM generations in ``simulate``: Spillway's default against every baseline's sweep on
the time to first token (TTFT) and the spend, per published token-length distribution.

Each cell runs every policy on the same requests: prompt and output lengths from the Azure LLM
inference trace 2023 (``gateway_plugin/simulation/tokens.py``), arrivals shaped as steady Poisson,
bursty (``burst``) and diurnal (``daily``) serverless traffic at a mean load (rate over the
cluster's capacity: its sequence slots over the mean stream's seconds), 20 % of them on-prem-only;
the cluster reads its load from the latency estimate alone or also from the engine's gauges (vLLM's
waiting queue and KV-cache use, ``local.thresholds.engine``). The target is a Lambda function billed
by the GB-second for the whole stream plus a price per generated token. The oracle is left out:
it plans whole answers, not first tokens, so it bounds nothing here.

    flock /tmp/spillway-bench.lock python bench/simulation_generation.py [--seconds 900] \\
        [--seeds 7,11] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.simulation.frontier import sweep
from gateway_plugin.simulation.tokens import TRACES
from gateway_plugin.simulation.trace import Shaping, generate

SLOTS = 16
PREFILL_MS_PER_1K, MS_PER_TOKEN = 40.0, 20.0
TTFT_MS = 500
SHAPES = ("poisson", "burst", "daily")
LOADS = (0.6, 0.9, 1.2, 2.0)
SHARE = 0.2


def config(tokens: str, engine: bool) -> SpillwayConfig:
    local: dict[str, Any] = {
        "endpoints": [{"url": "http://127.0.0.1:8000", "metrics_url": "http://127.0.0.1:8002/metrics"}],
        "parallelism": SLOTS,
        "latency_target_ms": 120_000,
        "model_ttft_targets_ms": {"llm": TTFT_MS},
    }
    if engine:
        local["thresholds"] = {"engine": {"backend": "vllm"}}
    return SpillwayConfig.model_validate(
        {
            "local": local,
            "targets": [
                {
                    "name": "aws",
                    "kind": "aws_lambda",
                    "url": "https://aws.example/",
                    "concurrency_cap": 64,
                    "cold_start_ms": 3000,
                    "idle_ttl_s": 600,
                    "cost": {
                        "usd_per_request": 0.0000002,
                        "memory_gb": 10,
                        "usd_per_gb_second": 0.0000166667,
                        "usd_per_output_token": 0.000001,
                        "expected_duration_ms": 4000,
                        "expected_output_tokens": 200,
                    },
                }
            ],
            "simulation": {
                "model": "llm",
                "generation": {
                    "tokens": tokens,
                    "prefill_ms_per_1k_tokens": PREFILL_MS_PER_1K,
                    "ms_per_output_token": MS_PER_TOKEN,
                },
            },
        }
    )


def capacity(tokens: str) -> float:
    """Streams a second the cluster finishes at full use: its slots over the mean stream's time."""
    lengths = TRACES[tokens]
    stream_s = (lengths.mean_prompt * PREFILL_MS_PER_1K / 1000 + lengths.mean_output * MS_PER_TOKEN) / 1000
    return SLOTS / stream_s


def cell(tokens: str, engine: bool, shape: str, load: float, seconds: int, seed: int) -> dict[str, Any]:
    rate = load * capacity(tokens)
    params = {"rate" if shape == "poisson" else "mean": rate, "seconds": seconds}
    trace = generate(shape, params)
    frontier = sweep(config(tokens, engine), trace, Shaping(confidential_share=SHARE), seed, oracle=False)
    s = frontier["spillway_default"]
    points = [p for p in frontier["points"] if p["policy"] != "spillway"]
    best = max(points, key=lambda p: (p["slo_attainment"], -p["cloud_cost_usd"]))
    return {
        "slo": s["slo_attainment"],
        "spend": s["cloud_cost_usd"],
        "best_baseline": f"{best['policy']}{best['params']}",
        "best_baseline_slo": best["slo_attainment"],
        "best_baseline_spend": best["cloud_cost_usd"],
        "dominated": frontier["dominated"],
        "dominated_by_points": frontier["most_slo_points_more"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=900)
    parser.add_argument("--seeds", default="7,11")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    cells: dict[str, Any] = {}
    for tokens in TRACES:
        for engine in (False, True):
            for shape in SHAPES:
                for load in LOADS:
                    runs = [cell(tokens, engine, shape, load, args.seconds, seed) for seed in seeds]
                    label = f"{tokens} {'engine' if engine else 'estimate'} {shape} {load:g}x"
                    cells[label] = runs
                    if not args.json:
                        print(label, json.dumps(runs), flush=True)
    summary = {
        reading: {
            "cells": len(runs := [r for label, rs in cells.items() if f" {reading} " in label for r in rs]),
            "not_dominated": sum(not r["dominated"] for r in runs),
            "median_slo": statistics.median(r["slo"] for r in runs),
            "median_best_baseline_slo": statistics.median(r["best_baseline_slo"] for r in runs),
            "worst_dominated_by_points": max(r["dominated_by_points"] for r in runs),
        }
        for reading in ("estimate", "engine")
    }
    print(json.dumps({"cells": cells, "summary": summary} if args.json else summary))


if __name__ == "__main__":
    main()
