"""Redis killed mid-load and brought back, empty or with its data: what the nodes spend over a
shared budget, trial by trial, against the bound docs/deploying/multi-node.md states for it.

Each trial: ``nodes`` nodes (a ``GatewayState`` each, with its shared view, its own
``RedisStore`` and the real rounds of ``SharedSync``) share an hourly budget worth ``budget``
requests at $0.01 each and decide one request at a time in a random order; each runs a round
every 2-8 of its own decisions (its own pace, drawn per trial), and at its next decision when a
lease ran low (what wakes a runner's round). A real redis-server is killed (SIGKILL) after a
random number of decisions, the nodes go on alone for a random number more, the server comes
back (empty, or with its data from its append-only file, fsync'd on every write) and each node
finds it at its own next round; they go on until none may spend more.

The bound of a trial is the one docs/deploying/multi-node.md states: alone, each node
spends at most its unused lease plus ``1/N`` of what was left at its last round, so together at
most the budget plus ``1/N`` of what the others were leased after each one's last round. Here a
node's last round is its last answered round that carried its lease before its first failed one,
and "after" runs to its first answered round since: the blocks the others took in their latest
rounds before the kill, and any a node that never missed a round took before the others came
back. Redis back, each node's claim is its own field set to the larger value, never added.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import ROOT

from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.snapshot import RequestFeatures
from gateway_plugin.shared.leases import Lease
from gateway_plugin.shared.view import Round, SharedView
from gateway_plugin.shared_store import RedisStore
from gateway_plugin.shared_sync import SharedSync

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools.redis import RedisServer

WALL = 3600 * 500 + 60.0  # one fixed hour: no window rolls mid-trial
UNIT = 10_000_000  # $0.01 in nano-dollars
BUDGETS = (29, 100, 300)
PUBLIC = RequestFeatures("/v2/models/m/infer", {"x-data-classification": "public"}, {}, "m")


def restart_config(url: str, nodes: int, budget: int, prefix: str, replicas_ack: int = 0) -> SpillwayConfig:
    return SpillwayConfig.model_validate(
        {
            "targets": [
                {
                    "name": "aws",
                    "kind": "aws_lambda",
                    "url": "https://aws.example/",
                    "cost": {"usd_per_request": 0.01, "usd_per_gb_second": 0, "billed_init": False},
                }
            ],
            "rules": [{"name": "out", "action": "target", "targets": ["aws"]}],
            "budgets": {"per_target_hourly_usd": {"aws": budget / 100}},
            "metrics": {"listen": None},
            "outcomes": {"listen": None},
            "shared_state": {
                "redis_url": url,
                "nodes_expected": nodes,
                "key_prefix": prefix,
                "replicas_ack": replicas_ack,
            },
        }
    )


class Book:
    """What the stated bound reads, by the rounds' order: blocks leased (round, node, units), and
    each node's time alone (node, from its last answered round that carried its lease to its
    next answered round)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.leased: list[tuple[int, Node, int]] = []
        self.alone: list[tuple[Node, int, float]] = []

    def bound(self, limit: int, share: int) -> int:
        """The most the nodes may spend together by the stated bound, in units."""
        extra = 0
        for node, start, end in self.alone:
            extra += sum(units for at, other, units in self.leased if other is not node and start < at < end)
        return limit + extra // share


class Node:
    def __init__(self, cfg: SpillwayConfig, name: str, book: Book) -> None:
        assert cfg.shared_state is not None
        self.view = SharedView(cfg.shared_state, cfg, build_policy(cfg), name)
        self.state = GatewayState(cfg, GatewaySecrets.read(cfg), wall=lambda: WALL, shared=self.view)
        settings = cfg.shared_state
        self.sync = SharedSync(
            self.state, RedisStore(settings), settings.sync_period_ms / 1000, settings.timeout_ms / 1000
        )
        self.view.wake = self._woken
        self.book, self.woken, self.decided, self.carried = book, False, 0, False
        self.last_answered = 0  # the book's round that last answered with this node's lease
        self.alone_from: int | None = None  # that round, while this node's rounds fail
        answered = self.state.shared_answered

        def noted(sent: Round, reply: list[object]) -> None:
            answered(sent, reply)
            self.carried = any(lease is self.lease() for lease in sent.leases)

        self.state.shared_answered = noted  # type: ignore[method-assign]

    def _woken(self) -> None:
        self.woken = True

    def lease(self) -> Lease:
        lease = self.view.targets["aws"].hour
        assert lease is not None
        return lease

    def footprint(self) -> int:
        lease = self.lease()
        return max(lease.leased, lease.spent)

    async def round(self) -> bool:
        book = self.book
        book.rounds += 1
        before, self.carried = self.footprint(), False
        if not await self.sync.round():
            if self.alone_from is None:
                self.alone_from = self.last_answered
            return False
        book.leased.append((book.rounds, self, self.footprint() - before))
        if self.alone_from is not None:
            book.alone.append((self, self.alone_from, book.rounds))
            self.alone_from = None
        if self.carried:
            self.last_answered = book.rounds
        return True

    async def step(self, every: int) -> bool:
        """A round when due or woken, then one decision; whether it went to the cloud."""
        self.decided += 1
        if self.woken or self.decided % every == 0:
            self.woken = False
            await self.round()
        decision = decide(PUBLIC, self.state.snapshot(None, "m"), self.state.policy)
        self.state.commit(decision, "m")
        if decision.is_cloud:
            self.state.answered("aws", None, ok=True, seconds=0.01)
        return decision.is_cloud


@dataclass
class Trial:
    nodes: int
    comeback: str
    budget: int
    over_connected: int  # requests over the budget when Redis died
    over: int  # requests over the budget in the whole trial
    bound: int  # requests over the budget the stated bound allows in this trial
    spent: int


async def trial(server: RedisServer, nodes: int, budget: int, rng: random.Random, prefix: str) -> Trial:
    book = Book()
    cfg = restart_config(server.url, nodes, budget, prefix)
    made = [Node(cfg, f"node-{i}", book) for i in range(nodes)]
    for node in made:
        if not await node.round():
            raise SystemExit("redis-server did not answer")
    every = [rng.randint(2, 8) for _ in made]
    kill_at = rng.randint(1, budget + budget // 4)
    back_at = kill_at + rng.randint(0, 2 * budget)
    cloud = over_connected = 0
    for turn in range(1, back_at + 3 * budget + 300):
        if turn == kill_at:
            over_connected = cloud - budget
            await asyncio.to_thread(server.stop)
        if turn == back_at:
            await asyncio.to_thread(server.start)
        i = rng.randrange(nodes)
        cloud += await made[i].step(every[i])
    book.alone.extend((node, node.alone_from, float("inf")) for node in made if node.alone_from is not None)
    bound = book.bound(made[0].lease().limit, nodes) // UNIT - budget
    for node in made:
        await node.sync.close()
    comeback = "data" if server.persist else "empty"
    return Trial(nodes, comeback, budget, over_connected, cloud - budget, bound, cloud)


def restart_trials(folder: Path, trials: int, seed: int = 11) -> list[Trial]:
    """``trials`` per scenario: 2 and 3 nodes, Redis back empty and with its data; budgets in turn."""
    logging.getLogger("spillway").setLevel(logging.ERROR)  # every trial loses the store on purpose
    rng = random.Random(seed)
    done: list[Trial] = []
    for persist in (False, True):
        server = RedisServer(folder / ("data" if persist else "empty"), persist=persist)
        server.start()
        try:
            for nodes in (2, 3):
                for number in range(trials):
                    budget = BUDGETS[number % len(BUDGETS)]
                    prefix = f"restart-{nodes}-{number}"
                    done.append(asyncio.run(trial(server, nodes, budget, rng, prefix)))
        finally:
            server.stop()
    return done


def summary(trials: list[Trial]) -> list[dict[str, Any]]:
    """Per scenario: requests over the budget (max, p99, mean) beside the stated bound's."""
    rows = []
    for nodes in (2, 3):
        for comeback in ("empty", "data"):
            these = [t for t in trials if t.nodes == nodes and t.comeback == comeback]
            if not these:
                continue
            over = sorted(t.over for t in these)
            rows.append(
                {
                    "nodes": nodes,
                    "redis_back": comeback,
                    "trials": len(these),
                    "over_max": over[-1],
                    "over_p99": over[min(len(over) - 1, int(len(over) * 0.99))],
                    "over_mean": round(statistics.fmean(over), 2),
                    "bound_max": max(t.bound for t in these),
                    "bound_mean": round(statistics.fmean(t.bound for t in these), 2),
                    "trials_over_bound": sum(t.over > t.bound for t in these),
                    "worst_beyond_bound": max(t.over - t.bound for t in these),
                    "over_max_by_budget": {
                        b: max((t.over for t in these if t.budget == b), default=0) for b in BUDGETS
                    },
                    "bound_max_by_budget": {
                        b: max((t.bound for t in these if t.budget == b), default=0) for b in BUDGETS
                    },
                    "over_while_connected_max": max(t.over_connected for t in these),
                    "spent_min_share": round(min(t.spent / t.budget for t in these), 3),
                }
            )
    return rows
