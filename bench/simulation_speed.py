"""How fast the simulator runs: about a million requests through Spillway's own policy (the
runner's state and ``decide()``), against the same engine under ``all_local`` (no policy at all)
in the same run, so the ratio reads the same on a noisy machine. One process, one core.

    flock /tmp/spillway-bench.lock python bench/simulation_speed.py [--seconds 18000] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gateway_plugin.config import load
from gateway_plugin.simulation.baselines import AllLocal
from gateway_plugin.simulation.engine import simulate
from gateway_plugin.simulation.runner_policy import SpillwayRouter
from gateway_plugin.simulation.trace import Shaping, generate

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=18_000, help="trace length (about 55 requests/s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    config = load(ROOT / "examples" / "simulation" / "bursty.yaml")
    trace = generate("mmpp", {"base": 40, "burst": 110, "on_s": 20, "off_s": 90, "seconds": args.seconds})
    shaping = Shaping(confidential_share=0.2)
    out = {}
    for router in (AllLocal(config), SpillwayRouter(config)):
        started = time.process_time()
        measures = simulate(config, router, trace, shaping, seed=1)
        cpu_s = time.process_time() - started
        requests = measures.summary()["requests"]
        out[router.name] = {"requests": requests, "cpu_s": round(cpu_s, 2), "per_s": round(requests / cpu_s)}
    out["spillway_over_all_local"] = round(out["spillway"]["cpu_s"] / out["all_local"]["cpu_s"], 2)
    if args.json:
        print(json.dumps(out))
        return
    for name in ("all_local", "spillway"):
        row = out[name]
        print(f"{name:10} {row['requests']:>9,} requests in {row['cpu_s']:6.1f} s CPU ({row['per_s']:,}/s)")
    print(f"spillway / all_local: {out['spillway_over_all_local']}x")


if __name__ == "__main__":
    main()
