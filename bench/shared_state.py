"""What sharing state through Redis costs: per decision, and in Redis operations per node.

1. Decision cost: ``snapshot → decide → commit`` on a ``GatewayState`` alone and on one with a
   shared view (leases and slots granted by a real redis-server beforehand; the decision path
   itself does no I/O), p50/p99 in microseconds, both measured in the same run, interleaved in
   blocks so that the machine's noise falls on both alike.
2. Redis operations per node at a given decision rate (default 10,000/s): a real state with its
   background rounds (``sync_period_ms``) against a real redis-server, decisions paced on the
   event loop, every cloud decision answered a few milliseconds later. Counts the node's calls
   (one ``EVALSHA`` a round) and the commands the server ran for them (``INFO``), per second.
3. Overshoot with Redis gone mid-traffic: nodes that lose the store for good and go on alone.
4. Overshoot with Redis killed mid-load and brought back, empty or with its data
   (``shared_restart.py``): per scenario, requests over the budget beside the stated bound.
5. The same on a real runner with two workers and 16 connections (``shared_restart_runners.py``).

    python bench/shared_state.py [--calls 100000] [--rate 10000] [--seconds 10] [--json]
        [--parts cost,paced,overshoot,restart,runners] [--restart-trials 150] [--runner-trials 25]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from harness import ROOT
from shared_restart import restart_trials, summary
from shared_restart_runners import runner_trials

from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.snapshot import RequestFeatures
from gateway_plugin.shared.view import SharedView
from gateway_plugin.shared_store import RedisStore
from gateway_plugin.shared_sync import SharedSync

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools.redis import redis_server

os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
PUBLIC = RequestFeatures(
    "/v2/models/m/infer", {"x-data-classification": "public", "x-tenant": "search"}, {}, "m"
)
PRIVATE = RequestFeatures(
    "/v2/models/m/infer", {"x-data-classification": "pii", "x-tenant": "search"}, {}, "m"
)


def config(url: str | None, period_ms: int = 100) -> SpillwayConfig:
    data: dict[str, Any] = {
        "targets": [
            {"name": "aws", "kind": "aws_lambda", "url": "https://aws.example/", "concurrency_cap": 200},
            {"name": "ali", "kind": "aliyun_fc", "url": "https://ali.example/", "concurrency_cap": 200},
        ],
        "rules": [{"name": "out", "action": "target", "targets": ["aws", "ali"]}],
        "budgets": {"per_target_hourly_usd": {"aws": 1000.0, "ali": 1000.0}},
        "tenants": {"quotas": {"search": {"requests_per_minute": 10_000_000, "hourly_usd": 1000.0}}},
        "metrics": {"listen": None},
        "outcomes": {"listen": None},
    }
    if url is not None:
        data["shared_state"] = {"redis_url": url, "nodes_expected": 3, "sync_period_ms": period_ms}
    return SpillwayConfig.model_validate(data)


def state_for(cfg: SpillwayConfig, node: str = "bench-node") -> GatewayState:
    view = None
    if cfg.shared_state is not None:
        view = SharedView(cfg.shared_state, cfg, build_policy(cfg), node)
    return GatewayState(cfg, GatewaySecrets.read(cfg), shared=view)


def one_round(state: GatewayState, store: RedisStore) -> None:
    sent = state.shared_round()
    state.shared_answered(sent, store.exchange(sent.payload))
    if state.shared is not None:
        state.shared.connected = True


def decision_cost(url: str, calls: int, block: int = 2000) -> list[dict[str, Any]]:
    alone = state_for(config(None))
    shared_cfg = config(url)
    shared = state_for(shared_cfg)
    assert shared_cfg.shared_state is not None
    store = RedisStore(shared_cfg.shared_state)
    one_round(shared, store)
    rows = []
    for case, features in (("cloud", PUBLIC), ("residency-local", PRIVATE)):
        times: dict[str, list[int]] = {"alone": [], "shared": []}
        for _ in range(0, calls, block):
            for name, state in (("alone", alone), ("shared", shared)):
                times[name].extend(_timed(state, features, block))
            one_round(shared, store)  # between blocks, as the background rounds would
        alone_t, shared_t = sorted(times["alone"]), sorted(times["shared"])
        rows.append(
            {
                "case": case,
                "decision": decide(features, shared.snapshot("search", "m"), shared.policy).target,
                "alone_p50_us": _us(alone_t, 0.5),
                "alone_p99_us": _us(alone_t, 0.99),
                "shared_p50_us": _us(shared_t, 0.5),
                "shared_p99_us": _us(shared_t, 0.99),
                "p99_delta_us": round(_us(shared_t, 0.99) - _us(alone_t, 0.99), 2),
            }
        )
    store.close()
    return rows


def _timed(state: GatewayState, features: RequestFeatures, count: int) -> list[int]:
    clock = time.perf_counter_ns
    policy = state.policy
    out = []
    for _ in range(count):
        start = clock()
        snapshot = state.snapshot("search", "m")
        decision = decide(features, snapshot, policy)
        state.commit(decision, "m")
        out.append(clock() - start)
        if decision.is_cloud:
            state.answered(decision.target, "search", ok=True, seconds=0.01)
    return out


def _us(sorted_ns: list[int], q: float) -> float:
    return round(sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1000, 2)


async def _paced(url: str, port: int, rate: int, seconds: float, period_ms: int) -> dict[str, Any]:
    cfg = config(url, period_ms)
    assert cfg.shared_state is not None
    state = state_for(cfg)
    sync = SharedSync(
        state, RedisStore(cfg.shared_state), period_ms / 1000, cfg.shared_state.timeout_ms / 1000
    )
    if not await sync.round():
        raise SystemExit("redis-server did not answer")
    task = asyncio.ensure_future(sync.run())
    server = redis.Redis(port=port)
    commands0 = server.info("stats")["total_commands_processed"]
    rounds0, decided, cloud = sync.rounds, 0, 0
    loop = asyncio.get_running_loop()
    tick = 0.01
    start = loop.time()
    while (now := loop.time()) - start < seconds:
        due = int((now - start) * rate) - decided
        for _ in range(due):
            decision = decide(PUBLIC, state.snapshot("search", "m"), state.policy)
            state.commit(decision, "m")
            if decision.is_cloud:
                cloud += 1
                loop.call_later(0.005, state.answered, decision.target, "search", True, None, False, 0.005)
        decided += due
        await asyncio.sleep(tick)
    elapsed = loop.time() - start
    rounds = sync.rounds - rounds0
    commands = server.info("stats")["total_commands_processed"] - commands0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await sync.close()
    return {
        "decisions_per_s": round(decided / elapsed),
        "cloud_share": round(cloud / max(1, decided), 3),
        "sync_period_ms": period_ms,
        "redis_calls_per_s": round(rounds / elapsed, 1),
        "redis_commands_per_s": round(commands / elapsed, 1),
        "seconds": round(elapsed, 1),
    }


def overshoot(url: str, trials: int, nodes: int = 3, every: int = 5) -> dict[str, Any]:
    """A $1 hourly budget at $0.01 a request shared by ``nodes`` nodes deciding in turn, each running a
    round every ``every`` of its decisions; in each trial the store goes away for all of them after
    a random number of decisions (0 to 150) and they go on alone. What they spent beyond the budget,
    worst and mean over the trials, against the stated bound."""
    rng = random.Random(7)
    worst, total_over, connected_worst = 0, 0, 0
    for trial in range(trials):
        cfg = config(url)
        data = cfg.model_dump()
        data["targets"] = [dict(data["targets"][0], cost={"usd_per_request": 0.01, "usd_per_gb_second": 0})]
        data["rules"][0]["targets"] = ["aws"]
        data["budgets"] = {"per_target_hourly_usd": {"aws": 1.0}}
        data["tenants"] = {}
        data["shared_state"]["key_prefix"] = f"overshoot{trial}"
        cfg = SpillwayConfig.model_validate(data)
        assert cfg.shared_state is not None
        states = [state_for(cfg, f"node-{i}") for i in range(nodes)]
        store = RedisStore(cfg.shared_state)
        for state in states:
            one_round(state, store)
        cut, cloud, turn = rng.randint(0, 150), 0, 0
        while turn < 2000:
            state = states[turn % nodes]
            if turn == cut:
                for each in states:
                    assert each.shared is not None
                    each.shared.connected = False
                connected_worst = max(connected_worst, cloud - 100)
            decision = decide(PUBLIC, state.snapshot(None, "m"), state.policy)
            state.commit(decision, "m")
            if decision.is_cloud:
                cloud += 1
                state.answered("aws", None, ok=True, seconds=0.01)
            if turn < cut and (turn // nodes) % every == 0:
                one_round(state, store)
            turn += 1
        worst, total_over = max(worst, cloud - 100), total_over + max(0, cloud - 100)
        store.close()
    return {
        "trials": trials,
        "nodes": nodes,
        "round_every_decisions": every,
        "budget_requests": 100,
        "connected_max_over": connected_worst,
        "alone_max_over": worst,
        "alone_mean_over": round(total_over / trials, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=100_000, help="decisions per case and state")
    parser.add_argument("--rate", type=int, default=10_000, help="decisions per second in part 2")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--period-ms", type=int, default=100)
    parser.add_argument("--trials", type=int, default=200, help="trials of the overshoot experiment")
    parser.add_argument(
        "--restart-trials", type=int, default=150, help="trials per scenario of the Redis restart experiment"
    )
    parser.add_argument("--runner-trials", type=int, default=25, help="runner trials per kind")
    parser.add_argument("--parts", default="cost,paced,overshoot,restart,runners", help="which parts to run")
    parser.add_argument("--json", action="store_true", help="JSON lines (the default when not on a terminal)")
    args = parser.parse_args(argv)
    as_json = args.json or not sys.stdout.isatty()
    parts = set(args.parts.split(","))

    def show(rows: list[dict[str, Any]]) -> None:
        for row in rows:
            print(json.dumps(row) if as_json else _line(row), flush=True)

    folder = Path(tempfile.mkdtemp(prefix="spillway-bench-redis-"))
    with redis_server(folder / "server") as server:
        port = server.port
        url = f"redis://127.0.0.1:{port}/0"
        if "cost" in parts:
            print("[decision cost]", file=sys.stderr, flush=True)
            show(decision_cost(url, args.calls))
        if "paced" in parts:
            print(f"[{args.rate} decisions/s for {args.seconds:g} s]", file=sys.stderr, flush=True)
            show([asyncio.run(_paced(url, port, args.rate, args.seconds, args.period_ms))])
        if "overshoot" in parts:
            print("[overshoot: store gone mid-traffic]", file=sys.stderr, flush=True)
            show([overshoot(url, args.trials)])
    if "restart" in parts:
        print("[overshoot: Redis killed mid-load and brought back]", file=sys.stderr, flush=True)
        show(summary(restart_trials(folder, args.restart_trials)))
    if "runners" in parts:
        print("[overshoot: Redis killed under a runner with two workers]", file=sys.stderr, flush=True)
        show(runner_trials(folder, args.runner_trials))
    return 0


def _line(row: dict[str, Any]) -> str:
    return "  ".join(f"{k} {v}" for k, v in row.items())


if __name__ == "__main__":
    sys.exit(main())
