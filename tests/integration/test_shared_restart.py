"""Redis killed while nodes spend a shared budget, then brought back, empty (no persistence) or
with its data (an append-only file fsync'd on every write): one real redis-server, nodes in one
process, each round run by hand through ``SharedSync`` (so a killed server is a failed round, as
in a runner), the wall clock fixed.

The bound docs/deploying/multi-node.md states: alone, each node spends at most its unused lease plus
``1/N`` of what was left at its last round; back, claims are set, never added, so together the nodes
never spend more than the budget or, where more, the sum of those shares.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway_plugin.shared.leases import Lease
from gateway_plugin.shared_sync import SharedSync
from testing.redis import RedisServer, needs_redis
from tests.integration.test_shared_state import Clock, Node, config, times

pytestmark = [pytest.mark.integration, needs_redis]
__all__ = ["times"]

UNIT = 10_000_000  # $0.01 a request, in nano-dollars


class Syncing(Node):
    """A node whose rounds go through ``SharedSync``, as a runner's do: a round the store does not
    answer leaves the node deciding alone (``round_timeout_s``: the bound on each call)."""

    round_timeout_s = 5.0

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.rounds = SharedSync(self.state, self.store, period_s=0.1, timeout_s=self.round_timeout_s)

    def round(self) -> bool:
        return asyncio.run(self.rounds.round())

    def spend(self, most: int) -> int:
        """Up to ``most`` decisions, a round after each; how many went to the cloud."""
        cloud = 0
        for _ in range(most):
            cloud += self.decide().is_cloud
            self.round()
        return cloud

    def lease(self) -> Lease:
        lease = self.view.targets["aws"].hour
        assert lease is not None
        return lease

    def alone_at_most(self) -> int:
        """Requests the stated bound lets this node make in the window, from the last round's answer."""
        lease = self.lease()
        return (lease.leased + max(0, lease.limit - max(lease.total, lease.leased)) // lease.share) // UNIT


@pytest.fixture(params=["empty", "data"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    running = RedisServer(tmp_path / "redis", persist=request.param == "data")
    running.start()
    yield running
    running.stop()


def fleet(server: RedisServer, times: tuple[Clock, Clock], count: int, budget_usd: float) -> list[Syncing]:
    cfg = config(
        server.url,
        budgets={"per_target_hourly_usd": {"aws": budget_usd}},
        shared_state={"redis_url": server.url, "nodes_expected": count},
    )
    made = [Syncing(cfg, f"node-{i}", *times) for i in range(count)]
    for node in made:
        assert node.round()
    return made


@pytest.mark.parametrize("count", [2, 3])
def test_a_node_back_first_is_not_leased_what_the_others_spent_alone(
    server: RedisServer, times: tuple[Clock, Clock], count: int
) -> None:
    """The first node to find Redis again must not be leased, from a store that has not yet heard
    the others' claims, what they spent while it was away."""
    made = fleet(server, times, count, 0.29)
    spent = sum(node.spend(3) for node in made)
    server.stop()
    assert not any(node.round() for node in made)
    bound = max(29, sum(node.alone_at_most() for node in made))
    spent += sum(node.spend(40) for node in made)
    server.start()
    first, *others = made
    spent += first.spend(40)
    for node in others:
        spent += node.spend(40)
    spent += sum(node.spend(40) for node in made)
    assert spent <= bound, f"{spent} requests on a budget of 29; the stated bound is {bound}"


def test_what_a_node_left_unspent_alone_is_leased_again_once_all_are_back(
    server: RedisServer, times: tuple[Clock, Clock]
) -> None:
    """One node spends alone, the other has no traffic: back, the budget is the busy node's again
    once both have told their claims, less at most a block and a half per node leased and unused."""
    busy, idle = fleet(server, times, 2, 0.29)
    server.stop()
    assert not busy.round() and not idle.round()
    spent = busy.spend(40)
    assert spent < 29, "alone, half of what was left"
    server.start()
    assert idle.round() and busy.round()
    spent += busy.spend(40)
    assert spent < 29, "the idle node has not told its claims since the busy one came back"
    assert idle.round(), "its claims told since both came back: it is settled"
    assert idle.round(), "and hands back what it held of its alone share"
    spent += busy.spend(40)
    assert 29 - 3 <= spent <= 29


def test_a_concurrency_cap_holds_when_redis_comes_back(
    server: RedisServer, times: tuple[Clock, Clock]
) -> None:
    """Alone, each node fills what it held while the store would still count it, then a half of a
    cap of 6; back, the first node to find Redis may not add to them before the other has told
    the store what it holds."""
    cfg = config(server.url, shared_state={"redis_url": server.url, "nodes_expected": 2})
    cfg = cfg.model_copy(update={"targets": [cfg.targets[0].model_copy(update={"concurrency_cap": 6})]})
    a, b = (Syncing(cfg, f"node-{i}", *times) for i in range(2))
    assert a.round() and b.round()
    server.stop()
    assert not a.round() and not b.round()
    busy = a.spend(10) + b.spend(10)
    assert busy == 2, "alone, what each held (a block of one)"
    times[1].now += cfg.shared_state.node_ttl_ms / 1000  # type: ignore[union-attr]
    busy += a.spend(10) + b.spend(10)
    assert busy == 6, "alone and forgotten by the store: three each"
    server.start()
    busy += a.spend(10)
    assert busy == 6, "the first node back holds no more than it filled alone"
    busy += b.spend(10) + a.spend(10)
    assert busy == 6
    for _ in range(3):
        a.state.answered("aws", None, ok=True, seconds=0.1)
    b.round()
    a.round()
    assert a.spend(10) + b.spend(10) == 3, "back together: the slots freed are filled again"


def test_a_node_that_never_missed_a_round_is_not_leased_from_an_emptied_store(
    tmp_path: Path, times: tuple[Clock, Clock]
) -> None:
    """Redis restarted empty between two rounds of one node: that node never decided alone, but
    the store it finds no longer holds what the other node was leased or spent alone; it is
    leased nothing more until the other has told its claims again."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        away, unaware = fleet(server, times, 2, 0.29)
        spent = away.spend(3) + unaware.spend(3)
        server.stop()
        assert not away.round()
        bound = max(29, away.alone_at_most() + unaware.lease().leased // UNIT)
        spent += away.spend(40)
        low = unaware.lease()
        while low.leased - low.spent > low.block // 2:  # no round: unaware of the outage, it runs low
            spent += unaware.decide().is_cloud
        server.start()
        held = unaware.lease().leased
        assert unaware.round()
        assert unaware.lease().leased == held, "the round that finds the store emptied leases nothing"
        spent += unaware.spend(40)
        assert spent <= bound, f"{spent} requests; the unaware node may spend only what it held"
        spent += away.spend(40) + unaware.spend(40) + away.spend(40)
        assert spent <= bound
    finally:
        server.stop()
