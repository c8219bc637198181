"""Redis killed mid-load and brought back, on a real runner: ``python -m gateway_plugin run`` with
``runner.workers: 2`` (two nodes sharing the budget through Redis), 16 of APISIX's connections
(``devtools.apisix_peer``) sending requests as fast as the runner answers, a $0.29 hourly budget
at $0.01 a request (29 requests). In each trial, a fresh redis-server is killed (SIGKILL) 0 to
0.3 s into the traffic, brought back 0 to 1 s later (empty, or with its data from its append-only
file), and the traffic goes on for 1.5 s more, long after both workers found it again. Counts
the decisions that sent a request to the cloud target.

The rounds here run on the runners' own clocks (every 100 ms, sooner when a lease runs low), so
the stated bound's lag term (what the other worker was leased after each one's last round) is
not seen from outside; the figure is requests over the budget.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from harness import ROOT, free_port, http_call, launch, poll, running

from gateway_plugin.books.target_header import target_value

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools.apisix_peer import ApisixPeer, PeerRequest, RouteConf
from devtools.redis import RedisServer

ROUTE = RouteConf("route#spillway", [("spillway", "{}")])
REQUEST = PeerRequest("POST", "/v2/models/m/infer", headers=[("x-data-classification", "public")])
BUDGET = 29
CONNECTIONS = 16


def runner_config(url: str, metrics_port: int, outcomes_port: int) -> dict[str, Any]:
    return {
        "targets": [
            {
                "name": "aws",
                "kind": "aws_lambda",
                "url": "https://aws.example/",
                "timeout_s": 300,
                "concurrency_cap": 1000,
                "cost": {"usd_per_request": 0.01, "usd_per_gb_second": 0, "billed_init": False},
            }
        ],
        "rules": [{"name": "out", "action": "target", "targets": ["aws"]}],
        "budgets": {"per_target_hourly_usd": {"aws": BUDGET / 100}},
        "runner": {"workers": 2},
        "shared_state": {"redis_url": url, "nodes_expected": 1},
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        "outcomes": {"listen": f"127.0.0.1:{outcomes_port}"},
    }


def metrics_ports() -> int:
    """A free port whose next one is free too: worker ``i`` serves its metrics on port plus ``i``."""
    while True:
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def connected(port: int) -> bool:
    _, body = http_call(port, "GET", "/metrics")
    return b"\nspillway_shared_state_connected 1.0" in body


async def traffic(sock: Path, server: RedisServer, rng: random.Random) -> int:
    """Requests on every connection until the end; the cloud decisions."""
    aws = target_value("aws", os.environ["SPILLWAY_ROUTE_TOKEN"].encode())
    peer = ApisixPeer(sock, pool_size=CONNECTIONS, timeout_s=10)
    cloud, done = 0, asyncio.Event()

    async def connection() -> None:
        nonlocal cloud
        while not done.is_set():
            outcome = await peer.request(ROUTE, REQUEST)
            rewrite = outcome.rewrite
            cloud += rewrite is not None and dict(rewrite.headers).get("x-spillway-target") == aws

    tasks = [asyncio.ensure_future(connection()) for _ in range(CONNECTIONS)]
    await asyncio.sleep(rng.uniform(0, 0.3))
    await asyncio.to_thread(server.stop)
    await asyncio.sleep(rng.uniform(0, 1.0))
    await asyncio.to_thread(server.start)
    await asyncio.sleep(1.5)
    done.set()
    await asyncio.gather(*tasks)
    await peer.close()
    return cloud


def runner_trial(folder: Path, persist: bool, rng: random.Random) -> int:
    """Requests over the budget in one trial."""
    folder.mkdir(parents=True)
    server = RedisServer(folder / "redis", persist=persist)
    server.start()
    metrics_port = metrics_ports()
    outcomes_port = free_port()
    while outcomes_port in (metrics_port, metrics_port + 1):
        outcomes_port = free_port()
    config = folder / "spillway.yaml"
    config.write_text(yaml.safe_dump(runner_config(server.url, metrics_port, outcomes_port)))
    sock = folder / "runner.sock"
    env = {**os.environ, "APISIX_LISTEN_ADDRESS": f"unix:{sock}"}
    args = [sys.executable, "-m", "gateway_plugin", "run", "--config", str(config)]
    try:
        with running([launch(args, env, folder / "runner.log")]) as (runner,):
            alive = runner.proc.poll
            poll(sock.exists, 30, 0.05, lambda: alive() is None)
            for worker in (0, 1):
                poll(lambda w=worker: connected(metrics_port + w), 30, 0.05, lambda: alive() is None)
            return asyncio.run(traffic(sock, server, rng)) - BUDGET
    finally:
        server.stop()


def runner_trials(folder: Path, trials: int, seed: int = 5) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for persist in (False, True):
        over = []
        for number in range(trials):
            if time.time() % 3600 > 3590:  # a trial across the hour would start a fresh budget
                time.sleep(15)
            over.append(runner_trial(folder / f"runner-{int(persist)}-{number}", persist, rng))
        over.sort()
        rows.append(
            {
                "runner_workers": 2,
                "connections": CONNECTIONS,
                "budget_requests": BUDGET,
                "redis_back": "data" if persist else "empty",
                "trials": trials,
                "over_max": over[-1],
                "over_p99": over[min(len(over) - 1, int(len(over) * 0.99))],
                "over_mean": round(statistics.fmean(over), 2),
                "trials_over_budget": sum(o > 0 for o in over),
            }
        )
    return rows
