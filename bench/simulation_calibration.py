"""How close the simulator comes to the real local stack: the demo's real Triton, runner,
development gateway and function pools take a short bursty trace, and the simulator replays the
same requests (``devtools.sim_calibration``). Each run prints both sides and their ratio, so a
loaded machine moves both; several runs show the spread.

    flock /tmp/spillway-bench.lock python bench/simulation_calibration.py [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    os.environ.setdefault("SPILLWAY_SIGNING_KEY", demo.SIGNING_KEY)
    os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
    rows = []
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="spillway-calibration-") as out:
            figures = calibrate(Path(out))
        real, sim = figures["real"], figures["simulated"]
        rows.append(
            {
                "run": run,
                "requests": figures["requests"],
                "errors": figures["errors"],
                "real_p99_ms": round(real["p99_ms"], 1),
                "simulated_p99_ms": round(sim["p99_ms"], 1),
                "p99_ratio": round(sim["p99_ms"] / real["p99_ms"], 3),
                "real_cloud_share": round(real["cloud_share"], 3),
                "simulated_cloud_share": round(sim["cloud_share"], 3),
                "cloud_share_points": round(100 * (sim["cloud_share"] - real["cloud_share"]), 1),
            }
        )
        if not args.json:
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
