"""Cold hits and tail latency under bursty traffic, with and without warm-up, in one run.

A local pool of real function instances (each with its Triton sidecar) stands in for the
platform: one request per instance at a time, idle instances reaped after a TTL, a start-up
delay standing for image pull and model load. Traffic comes in bursts separated by idle gaps
longer than the TTL, so without warm-up every burst meets a cold pool. With warm-up, the pinger
keeps N instances warm with overlapping pings every ``--ping-every`` seconds (shorter than the
TTL). Time is compressed (seconds for the platforms' minutes); the ratios are what carry over.

    python bench/warmup_cold_hits.py [--bursts 5] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from devtools.local_pool import PoolSettings, running_pool
from functions.contract import HEADER_COLD, warmup_payload
from gateway_plugin.config import Target
from warmup.pinger import warm_target
from warmup.transports import HttpTransport, pooled_session

EXAMPLE_MODELS = Path(__file__).resolve().parent.parent / "examples" / "model_repository"
ADD_SUB_BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]},
        ]
    }
).encode()


def _burst(
    url: str, clients: int, seconds: float, out: list[tuple[float, bool]], lock: threading.Lock
) -> None:
    host, port = url.removeprefix("http://").split(":")

    def client() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.perf_counter()
            conn.request(
                "POST", "/v2/models/add_sub/infer", ADD_SUB_BODY, {"content-type": "application/json"}
            )
            answer = conn.getresponse()
            answer.read()
            with lock:
                out.append((time.perf_counter() - start, answer.getheader(HEADER_COLD) == "1"))
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def scenario(repo: Path, args: argparse.Namespace, warm: bool) -> dict[str, Any]:
    samples: list[tuple[float, bool]] = []
    lock = threading.Lock()
    stop = threading.Event()
    settings = PoolSettings(
        repo, max_instances=args.clients, idle_ttl_s=args.ttl, start_delay_s=args.start_delay
    )
    with running_pool(settings) as (url, pool):
        target = Target(name="pool", kind="http", url=url, signing_key_env=None)
        transport = HttpTransport(target, pooled_session())
        payload = warmup_payload(dwell_ms=args.dwell_ms, models=("add_sub",))

        def pinger() -> None:
            while not stop.is_set():
                start = time.perf_counter()
                warm_target(
                    "pool",
                    transport,
                    args.clients,
                    payload,
                    models=["add_sub"],
                    probe=False,
                    waves=2,
                    timeout_s=60,
                )
                stop.wait(max(0.0, args.ping_every - (time.perf_counter() - start)))

        if warm:
            threading.Thread(target=pinger, daemon=True).start()
            time.sleep(args.start_delay + 5)
        served_start, warm_start = pool.stats.busy_seconds, pool.stats.warmup_busy_seconds
        for _ in range(args.bursts):
            _burst(url, args.clients, args.burst_s, samples, lock)
            time.sleep(args.gap_s)
        stop.set()
        served = pool.stats.busy_seconds - served_start
        warm_cost = pool.stats.warmup_busy_seconds - warm_start
        cold_starts = pool.stats.cold_starts
    latencies = sorted(s for s, _ in samples)
    cold_hits = sum(1 for _, cold in samples if cold)
    return {
        "warmup": warm,
        "requests": len(samples),
        "cold_hits": cold_hits,
        "cold_share": round(cold_hits / max(1, len(samples)), 4),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
        "p999_ms": round(latencies[int(len(latencies) * 0.999)] * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 1),
        "cold_starts": cold_starts,
        "served_instance_s": round(served, 2),
        "warmup_instance_s": round(warm_cost, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bursts", type=int, default=5)
    parser.add_argument(
        "--clients", type=int, default=3, help="concurrent clients in a burst (= warm instances)"
    )
    parser.add_argument("--burst-s", type=float, default=4.0)
    parser.add_argument(
        "--gap-s", type=float, default=8.0, help="idle time between bursts (longer than --ttl)"
    )
    parser.add_argument("--ttl", type=float, default=6.0, help="idle instances are reaped after this")
    parser.add_argument(
        "--start-delay", type=float, default=1.0, help="added to each cold start (image pull)"
    )
    parser.add_argument("--ping-every", type=float, default=5.0, help="shorter than --ttl")
    parser.add_argument("--dwell-ms", type=int, default=20, help="how long each ping holds its instance")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    as_json = args.json or not sys.stdout.isatty()
    repo = Path(tempfile.mkdtemp(prefix="spillway-warm-bench-"))
    shutil.copytree(EXAMPLE_MODELS / "add_sub", repo / "add_sub")
    rows = [scenario(repo, args, warm=False), scenario(repo, args, warm=True)]
    cold, warm = rows
    ratio = {
        "cold_hit_reduction": round(cold["cold_hits"] / warm["cold_hits"], 1)
        if warm["cold_hits"]
        else f"none with warm-up ({cold['cold_hits']} without)",
        "p99_ratio": round(warm["p99_ms"] / cold["p99_ms"], 3),
        "warmup_cost_share": round(warm["warmup_instance_s"] / max(1e-9, warm["served_instance_s"]), 4),
    }
    for row in [*rows, ratio]:
        print(json.dumps(row) if as_json else "  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
