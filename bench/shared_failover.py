"""The master of a Sentinel group or a Redis Cluster killed mid-spending: how long until its
replica is promoted, how soon each node finds it, and what the nodes spend over a shared budget,
trial by trial, against the bound docs/deploying/multi-node.md states.

Each trial is ``shared_restart.py``'s, with a failover instead of a restart: ``nodes`` nodes (a
``GatewayState`` each, with its shared view, its own ``RedisStore`` on the group's URL and the
real rounds of ``SharedSync``) share an hourly budget worth ``budget`` requests at $0.01 and decide
one request at a time in a random order, each running a round every 2-8 of its own decisions and
when a lease ran low. After a random number of decisions (up to 1.25 x the budget) the master
that holds the keys' hash slot is killed (SIGKILL); the nodes go on deciding, paced so that the
failover lasts a random 0.25-2 x the budget's decisions, each round failing until its node finds
the promoted replica; then 3 x the budget plus 300 decisions more. The old master comes back as a
replica between trials. Per trial: the failover's seconds (kill to promotion, as the sentinels
or the Cluster's nodes report it), each node's seconds from the promotion to its first answered
round, requests over the budget beside the stated bound (``shared_restart.Book``), and whether the
promoted master's books hold each node's claim once (its field equals the node's own
``max(leased, spent)`` once every node has settled).

Each node runs with ``shared_state.replicas_ack`` (``--replicas-ack``, 1 by default: an answer is
used once a replica holds the round's writes; 0 for the asynchronous replication alone).

    python bench/shared_failover.py [--trials 120] [--modes sentinel,cluster] [--replicas-ack 1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import secrets
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import ROOT
from shared_restart import BUDGETS, UNIT, Book, Node, restart_config

from gateway_plugin.config import SharedState
from gateway_plugin.shared_store import make_client

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools.redis_ha import ClusterGroup, Promotion, SentinelGroup

os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
FAILOVER_GUESS_S = 2.5  # what the pacing spreads the decisions during a failover over
SENTINEL_FAILOVER_TIMEOUT_MS = 1000
SETTLE_S = 30.0  # how long a trial's first rounds may wait for the group to settle after a rejoin


@dataclass
class Trial:
    mode: str
    nodes: int
    budget: int
    failover_s: float
    follow_s: list[float]  # per node: promotion to its first answered round
    over: int
    bound: int
    over_connected: int
    counted_once: bool
    spent: int


class Watched(Node):
    """A ``shared_restart`` node that notes when its rounds answer again."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.back_at: float | None = None

    async def round(self) -> bool:
        ok = await super().round()
        if ok and self.back_at is None:
            self.back_at = time.monotonic()
        return ok


def kill(group: SentinelGroup | ClusterGroup, key: str) -> tuple[threading.Thread, list[Promotion]]:
    done: list[Promotion] = []
    if isinstance(group, SentinelGroup):
        old = group.master_port()
        assert old is not None
        killed_at = group.kill_master()
        watch = threading.Thread(target=lambda: done.append(group.wait_promotion(old, killed_at)))
    else:
        old, killed_at = group.kill_master(key)
        watch = threading.Thread(target=lambda: done.append(group.wait_promotion(key, old, killed_at)))
    watch.start()
    return watch, done


def claims_once(group: SentinelGroup | ClusterGroup, prefix: str, made: list[Watched]) -> bool:
    lease = made[0].lease()
    client: Any = make_client(SharedState(redis_url=group.url))
    try:
        fields = client.hgetall(f"{{{prefix}}}:lease:{lease.key}:{lease.window}")
    finally:
        client.close()
    held = {k.decode(): int(v) for k, v in fields.items()}
    return held == {n.view.node: max(n.lease().leased, n.lease().spent) for n in made}


async def trial(
    group: SentinelGroup | ClusterGroup,
    mode: str,
    nodes: int,
    budget: int,
    rng: random.Random,
    prefix: str,
    replicas_ack: int,
) -> tuple[Trial, Promotion]:
    book = Book()
    made = [
        Watched(restart_config(group.url, nodes, budget, prefix, replicas_ack), f"node-{i}", book)
        for i in range(nodes)
    ]
    for node in made:  # the old master may still be syncing as a replica: what WAIT waits for
        deadline = time.monotonic() + SETTLE_S
        while not await node.round():
            if time.monotonic() > deadline:
                raise SystemExit(f"{mode}: the store did not answer within {SETTLE_S} s of the trial's start")
            await asyncio.sleep(0.1)
    every = [rng.randint(2, 8) for _ in made]
    kill_at = rng.randint(1, budget + budget // 4)
    pace_s = FAILOVER_GUESS_S / (rng.uniform(0.25, 2.0) * budget)
    cloud = over_connected = 0
    for _ in range(1, kill_at):
        i = rng.randrange(nodes)
        cloud += await made[i].step(every[i])
    over_connected = cloud - budget
    for node in made:
        node.back_at = None
    watch, promoted = kill(group, f"{{{prefix}}}:round")
    while watch.is_alive():
        i = rng.randrange(nodes)
        cloud += await made[i].step(every[i])
        await asyncio.sleep(pace_s)
    watch.join()
    (promotion,) = promoted
    for turn in range(3 * budget + 300):
        i = turn % nodes if turn < 4 * nodes else rng.randrange(nodes)
        cloud += await made[i].step(every[i])
    for _ in range(3):  # every node settled: its claims told, its hold handed back
        for node in made:
            await node.round()
    book.alone.extend((n, n.alone_from, float("inf")) for n in made if n.alone_from is not None)
    bound = book.bound(made[0].lease().limit, nodes) // UNIT - budget
    # A node may find the new master before every sentinel (or Cluster node) says so: 0 then.
    follow = [round(max(0.0, (n.back_at or promotion.promoted_at) - promotion.promoted_at), 3) for n in made]
    once = claims_once(group, prefix, made)
    for node in made:
        await node.sync.close()
    done = Trial(
        mode,
        nodes,
        budget,
        round(promotion.seconds, 3),
        follow,
        cloud - budget,
        bound,
        over_connected,
        once,
        cloud,
    )
    return done, promotion


def run_mode(mode: str, folder: Path, trials: int, seed: int, replicas_ack: int) -> list[Trial]:
    logging.getLogger("spillway").setLevel(logging.ERROR)  # every trial loses the master on purpose
    rng = random.Random(seed)
    group: SentinelGroup | ClusterGroup = (
        SentinelGroup(folder, failover_timeout_ms=SENTINEL_FAILOVER_TIMEOUT_MS)
        if mode == "sentinel"
        else ClusterGroup(folder)
    )
    done: list[Trial] = []
    group.start()
    try:
        for number in range(trials):
            if number and mode == "sentinel":  # a sentinel fails a master name over again only
                time.sleep(2 * SENTINEL_FAILOVER_TIMEOUT_MS / 1000)  # 2 x failover-timeout later
            nodes = 2 if number % 2 == 0 else 3
            budget = BUDGETS[(number // 2) % len(BUDGETS)]
            result, promotion = asyncio.run(
                trial(group, mode, nodes, budget, rng, f"failover-{number}", replicas_ack)
            )
            group.rejoin(promotion)
            done.append(result)
            print(f"{mode} {number + 1}/{trials}: {_line(asdict(result))}", file=sys.stderr, flush=True)
    finally:
        group.stop()
    return done


def summary(trials: list[Trial]) -> list[dict[str, Any]]:
    rows = []
    for mode in sorted({t.mode for t in trials}):
        for nodes in (2, 3):
            these = [t for t in trials if t.mode == mode and t.nodes == nodes]
            if not these:
                continue
            follow = sorted(s for t in these for s in t.follow_s)
            failover = sorted(t.failover_s for t in these)
            rows.append(
                {
                    "mode": mode,
                    "nodes": nodes,
                    "trials": len(these),
                    "failover_s_p50": failover[len(failover) // 2],
                    "failover_s_max": failover[-1],
                    "follow_s_p50": follow[len(follow) // 2],
                    "follow_s_p99": follow[min(len(follow) - 1, int(len(follow) * 0.99))],
                    "follow_s_max": follow[-1],
                    "over_max": max(t.over for t in these),
                    "over_mean": round(statistics.fmean(t.over for t in these), 2),
                    "bound_max": max(t.bound for t in these),
                    "trials_over_bound": sum(t.over > t.bound for t in these),
                    "over_while_connected_max": max(t.over_connected for t in these),
                    "counted_twice": sum(not t.counted_once for t in these),
                    "spent_min_share": round(min(t.spent / t.budget for t in these), 3),
                }
            )
    return rows


def _line(row: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in row.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=120, help="per mode, half with 2 nodes, half with 3")
    parser.add_argument("--modes", default="sentinel,cluster")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--replicas-ack", type=int, default=1, help="shared_state.replicas_ack (0: no WAIT)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    done: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="spillway-failover-") as tmp:
        for mode in args.modes.split(","):
            done += run_mode(mode, Path(tmp) / mode, args.trials, args.seed, args.replicas_ack)
    rows = summary(done)
    if args.json:
        print(json.dumps({"summary": rows, "trials": [asdict(t) for t in done]}))
    else:
        for row in rows:
            print(_line(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
