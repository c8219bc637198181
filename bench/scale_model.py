"""N gateway nodes sharing one store, past what this machine runs: measured where it can be, the
rest arithmetic from docs/deploying/multi-node.md's stated rules, checked against the two-node measurement.

Measured: what one round costs the Redis server as N grows. N nodes (a ``GatewayState`` each with
its shared view and its own ``RedisStore``) share one real redis-server: two targets with hourly
and daily budgets and a concurrency cap, one tenant with a rate and an hourly quota, every node
spending on all of them; after a warm-up, ``--rounds`` rounds per node, one node after another.
Redis's own ``INFO commandstats`` gives the server's microseconds per ``EVALSHA`` and the commands
each ran inside the script (the script reads every node's field of each lease and slot hash, so
its cost grows with N).

Modelled, per N, each node at ``--rate`` decisions/s (``--cloud-share`` of them to the cloud):
- rounds per node per second: one per ``sync_period_ms``, plus early ones when a lease or a cap's
  slots run low, at most ten per period; the worst case is ten per period (a cap that binds keeps
  every node short of slots);
- the store's load: N x rounds x the measured cost, against one core (one shard carries every key
  of a ``key_prefix``: they share one hash slot, so a Cluster's other shards take none of it);
- lease blocks and what can stay leased and unused (a block and a half per node), for the default
  ``lease_share`` (0.02) and for ``min(0.02, 0.05 / N)``;
- the worst overshoot of a budget when the store goes away (a failover, a restart): the budget
  plus ``1/N`` of what the others were leased after each one's last round, which is at most
  ``(N - 1)`` x what one node may be leased in a period (a block, and twice its spend in a period:
  a node asks again only once it spent half a block), and never more than the budget;
- a cap while the store is away: each node fills ``max(1, cap // N)`` slots.

    python bench/scale_model.py [--nodes 2,5,10,25,50,100] [--rounds 20] [--two-node multi_node.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis
from harness import ROOT

from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.snapshot import RequestFeatures
from gateway_plugin.shared.leases import lease_block
from gateway_plugin.shared.view import SharedView
from gateway_plugin.shared_store import RedisStore

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools.redis import redis_server

os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
PUBLIC = RequestFeatures("/v2/models/m/infer", {"x-data-classification": "public", "x-tenant": "t"}, {}, "m")
CORE_US_PER_S = 1_000_000


def config(url: str, nodes: int, prefix: str) -> SpillwayConfig:
    target = {"kind": "aws_lambda", "url": "https://aws.example/", "concurrency_cap": 1000}
    return SpillwayConfig.model_validate(
        {
            "targets": [{"name": "aws", **target}, {"name": "aws2", **target}],
            "rules": [{"name": "out", "action": "target", "targets": ["aws", "aws2"]}],
            "budgets": {
                "per_target_hourly_usd": {"aws": 1e6, "aws2": 1e6},
                "per_target_daily_usd": {"aws": 1e7, "aws2": 1e7},
            },
            "tenants": {"quotas": {"t": {"requests_per_minute": 10**9, "hourly_usd": 1e6}}},
            "metrics": {"listen": None},
            "outcomes": {"listen": None},
            "shared_state": {"redis_url": url, "nodes_expected": nodes, "key_prefix": prefix},
        }
    )


def round_cost(url: str, port: int, nodes: int, rounds: int) -> dict[str, float]:
    """The server's µs per round and the commands it ran per round, with ``nodes`` nodes."""
    cfg = config(url, nodes, f"scale-{nodes}-{secrets.token_hex(3)}")
    assert cfg.shared_state is not None
    made = []
    for i in range(nodes):
        view = SharedView(cfg.shared_state, cfg, build_policy(cfg), f"node-{i}")
        made.append((GatewayState(cfg, GatewaySecrets.read(cfg), shared=view), RedisStore(cfg.shared_state)))

    def one(state: GatewayState, store: RedisStore) -> None:
        for _ in range(3):
            decision = decide(PUBLIC, state.snapshot("t", "m"), state.policy)
            state.commit(decision, "m")
        sent = state.shared_round()
        state.shared_answered(sent, store.exchange(sent.payload))
        assert state.shared is not None
        state.shared.connected = True

    for _ in range(3):
        for state, store in made:
            one(state, store)
    with redis.Redis(port=port) as client:
        client.config_resetstat()
        for _ in range(rounds):
            for state, store in made:
                one(state, store)
        stats = client.info("commandstats")
    for _, store in made:
        store.close()
    evalsha = stats["cmdstat_evalsha"]
    inner = sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_evalsha", "cmdstat_config"))
    return {
        "nodes": nodes,
        "server_us_per_round": round(float(evalsha["usec_per_call"]), 1),
        "commands_per_round": round(inner / int(evalsha["calls"]), 1),
    }


def model(
    costs: list[dict[str, float]], rate: float, cloud_share: float, period_ms: int
) -> list[dict[str, Any]]:
    """Per N: the store's load, and per lease share (the default, and ``0.05 / N``) the blocks,
    what may stay leased and unused, the worst overshoot when the store goes away; cap use."""
    rows = []
    period = period_ms / 1000
    for cost in costs:
        n = int(cost["nodes"])
        spend = rate * cloud_share  # cloud requests per node per second
        budget = n * spend * 1800  # an hourly budget the nodes at full rate spend in half an hour
        low, high = 1 / period, 10 / period
        row: dict[str, Any] = {
            "nodes": n,
            "store_calls_s": [round(n * low), round(n * high)],
            "store_core_share": [
                round(n * rounds * cost["server_us_per_round"] / CORE_US_PER_S, 3) for rounds in (low, high)
            ],
            "commands_s": [round(n * rounds * cost["commands_per_round"]) for rounds in (low, high)],
            "budget_requests": round(budget),
            "cap_away_filled_of_1000": n * max(1, 1000 // n),
            "cap_away_filled_of_50": n * max(1, 50 // n),
        }
        for name, share in (("default", 0.02), ("per_node", min(0.02, 0.05 / n))):
            block = lease_block(int(budget), n, share, 1)
            leased_per_period = block + 2 * spend * period  # what one node may be leased in a period
            row[name] = {
                "lease_share": round(share, 5),
                "block_requests": block,
                "asks_s_per_node": round(spend / (block / 2), 3),
                "unused_at_most_share": round(min(1.0, 1.5 * n * block / budget), 3),
                "over_worst_share": round(min(1.0, (n - 1) * leased_per_period / budget), 4),
            }
        rows.append(row)
    return rows


def check_two_nodes(path: Path | None) -> dict[str, Any] | None:
    """The two-node measurement beside the model's N = 2: rounds per node per second."""
    if path is None:
        return None
    measured = json.loads(path.read_text())
    calls = [c for row in measured.get("throughput", []) for c in row["redis_calls_s_per_node"]]
    return {"measured_rounds_s_per_node": [min(calls), max(calls)] if calls else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="2,5,10,25,50,100")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--rate", type=float, default=10_000)
    parser.add_argument("--cloud-share", type=float, default=0.5)
    parser.add_argument("--period-ms", type=int, default=100)
    parser.add_argument("--two-node", type=Path, default=None, help="bench/multi_node.py --json output")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="spillway-scale-") as tmp, redis_server(Path(tmp)) as server:
        costs = []
        for n in (int(x) for x in args.nodes.split(",")):
            costs.append(round_cost(server.url, server.port, n, args.rounds))
            print(json.dumps(costs[-1]), file=sys.stderr, flush=True)
    out = {
        "costs": costs,
        "model": model(costs, args.rate, args.cloud_share, args.period_ms),
        "two_nodes": check_two_nodes(args.two_node),
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
