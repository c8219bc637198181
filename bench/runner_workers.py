"""The runner with 1 and 2 worker processes on one socket: calls per second and CPU per call.

Each cell starts ``python -m gateway_plugin run`` as APISIX would, with ``runner.workers`` 1 or 2
and ``shared_state`` on a real redis-server started here (the same for both, so the only change is
the number of workers), then one load-generator process plays APISIX (``runner_throughput``'s
client: one call at a time per connection) for the measuring time, after a one-second warm-up.
CPU per call is the user and system time of the runner's whole process tree (parent and workers)
over the calls answered. The machine's 2 cores are shared by the load generator and the workers,
so compare the rows of one run.

    python bench/runner_workers.py [--seconds 5] [--concurrency 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from harness import ROOT
from runner_throughput import CASES, SPILLWAY_CONFIG, _client_process

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools.redis import redis_server

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _tree_cpu_s(pid: int) -> float:
    """User + system seconds of ``pid`` and its children (the workers)."""
    total = 0.0
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    for each in [str(pid), *children]:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def _runner(tmp: Path, redis_url: str, workers: int) -> tuple[subprocess.Popen[bytes], Path]:
    cfg: dict[str, Any] = {
        **SPILLWAY_CONFIG,
        "runner": {"workers": workers},
        "outcomes": {"listen": None},
        "budgets": {"per_target_hourly_usd": {"aws": 1_000_000.0}},
        "shared_state": {"redis_url": redis_url, "nodes_expected": 1, "key_prefix": f"bench{workers}"},
    }
    (tmp / "spillway.yaml").write_text(yaml.safe_dump(cfg))
    sock = tmp / "runner.sock"
    env = {
        **os.environ,
        "APISIX_LISTEN_ADDRESS": f"unix:{sock}",
        "SPILLWAY_SIGNING_KEY": "bench-signing-key",
        "SPILLWAY_ROUTE_TOKEN": os.environ.get("SPILLWAY_ROUTE_TOKEN") or secrets.token_hex(32),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway_plugin", "run", "--config", str(tmp / "spillway.yaml")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not sock.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the runner did not start")
        time.sleep(0.05)
    return proc, sock


def _load(sock: Path, case: Any, concurrency: int, seconds: float) -> list[float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    client = ctx.Process(target=_client_process, args=(sock, case, concurrency, seconds, out))
    client.start()
    latencies: list[float] = sorted(out.get(timeout=seconds + 60))
    client.join()
    return latencies


def measure(redis_url: str, workers: int, case: str, concurrency: int, seconds: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="spillway-bench-workers-"))
    proc, sock = _runner(tmp, redis_url, workers)
    try:
        _load(sock, CASES[case], concurrency, 1.0)
        cpu0 = _tree_cpu_s(proc.pid)
        latencies = _load(sock, CASES[case], concurrency, seconds)
        cpu = _tree_cpu_s(proc.pid) - cpu0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    calls = len(latencies)
    return {
        "workers": workers,
        "case": case,
        "concurrency": concurrency,
        "calls_per_s": round(calls / seconds),
        "p50_us": round(latencies[calls // 2] * 1e6, 1),
        "p99_us": round(latencies[int(calls * 0.99)] * 1e6, 1),
        "runner_cpu_us_per_call": round(cpu / calls * 1e6, 1),
        "runner_cores_busy": round(cpu / seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per cell (default 5)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cases", nargs="+", default=["spillway-local", "spillway-cloud-unsigned-payload"])
    parser.add_argument("--json", action="store_true", help="JSON lines (the default when not on a terminal)")
    args = parser.parse_args(argv)
    as_json = args.json or not sys.stdout.isatty()
    with redis_server(Path(tempfile.mkdtemp(prefix="spillway-bench-redis-"))) as server:
        for case in args.cases:
            one = None
            for workers in (1, 2):
                print(f"[{case}, {workers} worker(s)]", file=sys.stderr, flush=True)
                row = measure(server.url, workers, case, args.concurrency, args.seconds)
                one = one or row
                row["calls_of_1_worker"] = round(row["calls_per_s"] / one["calls_per_s"], 2)
                print(
                    json.dumps(row) if as_json else "  ".join(f"{k} {v}" for k, v in row.items()), flush=True
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
