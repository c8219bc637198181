"""How close the simulator comes to the real local stack: the demo's real Triton, runner, gateway
(the development gateway, or a real APISIX with ``--gateway apisix``) and function pools take a
short bursty trace, a fifth of it on-prem-only, and the simulator replays the same requests
(``devtools.sim_calibration``). Each run prints both sides and their ratio, so a loaded machine
moves both; several runs show the spread. With ``--headroom 0,4`` each run is made once per value
of ``overflow.onprem_headroom``: the headroom kept for on-prem-only traffic shows, on both sides,
in what those requests take.

    flock /tmp/spillway-bench.lock python bench/simulation_calibration.py [--runs 3] [--json] \
        [--gateway dev|apisix] [--headroom 0,4]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path

from harness import ROOT

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools import demo
from devtools.sim_calibration import calibrate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gateway", choices=("dev", "apisix"), default="dev")
    parser.add_argument("--headroom", default="", help="values of overflow.onprem_headroom, e.g. 0,4")
    args = parser.parse_args()
    headrooms = [float(v) for v in args.headroom.split(",") if v] or [None]
    os.environ.setdefault("SPILLWAY_SIGNING_KEY", demo.SIGNING_KEY)
    os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
    rows = []
    for run, headroom in itertools.product(range(1, args.runs + 1), headrooms):
        with tempfile.TemporaryDirectory(prefix="spillway-calibration-") as out:
            figures = calibrate(Path(out), args.gateway, headroom)
        real, sim = figures["real"], figures["simulated"]
        rows.append(
            {
                "run": run,
                "gateway": figures["gateway"],
                "onprem_headroom": figures["onprem_headroom"],
                "requests": figures["requests"],
                "errors": figures["errors"],
                "real_p99_ms": round(real["p99_ms"], 1),
                "simulated_p99_ms": round(sim["p99_ms"], 1),
                "p99_ratio": round(sim["p99_ms"] / real["p99_ms"], 3),
                "real_cloud_share": round(real["cloud_share"], 3),
                "simulated_cloud_share": round(sim["cloud_share"], 3),
                "cloud_share_points": round(100 * (sim["cloud_share"] - real["cloud_share"]), 1),
                "real_onprem_p99_ms": round(real["onprem_p99_ms"], 1),
                "simulated_onprem_p99_ms": round(sim["onprem_p99_ms"], 1),
                "onprem_p99_ratio": round(sim["onprem_p99_ms"] / real["onprem_p99_ms"], 3),
                "real_onprem_slo": round(real["onprem_slo"], 4),
                "simulated_onprem_slo": round(sim["onprem_slo"], 4),
            }
        )
        if not args.json:
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
