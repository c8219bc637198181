"""Spillway against ``perfect`` and ``static_threshold`` on bursty traces: the goals table.

Goals: SLO attainment within 0.5 points of ``perfect`` at no more than 1.15x its cloud spend, and
at least 30 % cheaper than ``static_threshold`` at equal or better SLO attainment. The config is
``examples/simulation/bursty.yaml`` (a cluster that meets its 200 ms target at its mean load).

    flock /tmp/spillway-bench.lock python bench/simulation_goals.py [--seconds 1800] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gateway_plugin.config import load
from gateway_plugin.simulation.command import run_policies
from gateway_plugin.simulation.trace import Shaping, generate

ROOT = Path(__file__).resolve().parent.parent
TRACES = {
    "mmpp 40/110 rps": ("mmpp", {"base": 40, "burst": 110, "on_s": 20, "off_s": 90}),
    "mmpp 50/140 rps, short bursts": ("mmpp", {"base": 50, "burst": 140, "on_s": 8, "off_s": 40}),
    "diurnal 45 rps + 3x flash": ("diurnal", {"mean": 45, "amplitude": 0.4, "period_s": 900, "flash": 3}),
}


def goals(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    s, p, t = runs["spillway"], runs["perfect"], runs["static_threshold"]
    slo_gap = round((p["slo_attainment"] - s["slo_attainment"]) * 100, 2)
    vs_perfect = round(s["cloud_cost_usd"] / p["cloud_cost_usd"], 2) if p["cloud_cost_usd"] else None
    cheaper = round(1 - s["cloud_cost_usd"] / t["cloud_cost_usd"], 3) if t["cloud_cost_usd"] else None
    return {
        "slo_points_below_perfect": slo_gap,
        "spend_over_perfect": vs_perfect,
        "cheaper_than_static": cheaper,
        "slo_vs_static_points": round((s["slo_attainment"] - t["slo_attainment"]) * 100, 2),
        "perfect_goal_met": slo_gap <= 0.5 and vs_perfect is not None and vs_perfect <= 1.15,
        "static_goal_met": cheaper is not None
        and cheaper >= 0.3
        and s["slo_attainment"] >= t["slo_attainment"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=1800)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    config = load(ROOT / "examples" / "simulation" / "bursty.yaml")
    out = {}
    for label, (name, params) in TRACES.items():
        trace = generate(name, {**params, "seconds": args.seconds})
        runs = run_policies(config, trace, Shaping(confidential_share=0.2), args.seed)
        figures = {
            n: m.summary() for n, m in runs.items() if n in ("spillway", "perfect", "static_threshold")
        }
        out[label] = {"policies": figures, "goals": goals(figures)}
    if args.json:
        print(json.dumps(out))
        return
    for label, row in out.items():
        print(label)
        for name, f in row["policies"].items():
            print(
                f"  {name:17} SLO {f['slo_attainment']:.2%}  p99 {f['p99_ms']:7.0f} ms  "
                f"cloud {f['cloud_share']:.1%}  ${f['cloud_cost_usd']:.4f}  shed {f['shed']}"
            )
        print(f"  goals: {row['goals']}")


if __name__ == "__main__":
    main()
