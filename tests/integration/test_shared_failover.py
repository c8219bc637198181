"""Shared state on a Redis that survives its master's loss, for real: a Sentinel group (a master,
a replica, three ``redis-sentinel``) and a Redis Cluster (three masters with a replica each,
``redis-cli --cluster create``), all on loopback. The master holding Spillway's keys is killed
(SIGKILL) while nodes spend a shared budget; its replica is promoted; the nodes find it.

Nodes in one process, each round run through ``SharedSync`` after every decision (so a dead master
is a failed round, as in a runner, and what each node knew at its last answered round is exact): the
bound docs/deploying/multi-node.md states is the budget or, where more, the sum of each node's alone
share as its last answered round left it. The runner processes behind two real APISIX nodes go
through the same in test_apisix_nodes.py.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from devtools.redis import RedisServer
from devtools.redis_ha import (
    REDIS_SENTINEL,
    SENTINEL_HINT,
    ClusterGroup,
    Promotion,
    SentinelGroup,
    cluster_group,
    sentinel_group,
)
from gateway_plugin.config import SharedState
from gateway_plugin.shared.leases import Lease
from gateway_plugin.shared_store import make_client
from testing.http import wait_until
from testing.redis import needs_redis, redis_server
from tests.integration import test_shared_restart as restart
from tests.integration.test_shared_state import Clock, config

pytestmark = [pytest.mark.integration, needs_redis]

# The stated bound (docs/deploying/multi-node.md): a node finds the promoted replica within 10 s.
FOLLOW_S = 10.0
Group = SentinelGroup | ClusterGroup


class Syncing(restart.Syncing):
    """A node with the runner's own bound on each call to the store."""

    round_timeout_s = 2.0


@pytest.fixture(scope="module", params=["sentinel", "cluster"])
def group(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "sentinel":
        if REDIS_SENTINEL is None:
            pytest.skip(SENTINEL_HINT)
        with sentinel_group(folder) as sentinel:
            yield sentinel
    else:
        with cluster_group(folder) as cluster:
            yield cluster


def fail_over(group: Group, key: str) -> tuple[threading.Thread, list[Promotion]]:
    """Kill the master of ``key`` now; its replica's promotion is awaited on a thread."""
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


def fleet(
    group: Group, times: tuple[Clock, Clock], count: int, budget_usd: float, prefix: str
) -> list[Syncing]:
    cfg = config(
        group.url,
        budgets={"per_target_hourly_usd": {"aws": budget_usd}},
        shared_state={
            "redis_url": group.url,
            "nodes_expected": count,
            "key_prefix": prefix,
            "timeout_ms": 200,
        },
    )
    made = [Syncing(cfg, f"node-{i}", *times) for i in range(count)]
    for node in made:
        assert node.round()
    return made


def claims(group: Group, prefix: str, lease: Lease) -> dict[str, int]:
    """Each node's claim on ``lease`` in its window, as the promoted master holds it."""
    client: Any = make_client(SharedState(redis_url=group.url))
    try:
        fields = client.hgetall(f"{{{prefix}}}:lease:{lease.key}:{lease.window}")
        return {k.decode(): int(v) for k, v in fields.items()}
    finally:
        client.close()


@pytest.mark.parametrize("count", [2, 3])
def test_a_master_killed_mid_spending_keeps_the_budget_within_the_stated_bound(
    group: Group, count: int, request: pytest.FixtureRequest
) -> None:
    """Killed after a few decisions, the master's replica takes over while the nodes spend alone;
    each finds it within the stated bound, none is leased what another spent alone, and the new
    master's books hold each node's claim once, as the node itself counts it."""
    prefix = f"failover-{type(group).__name__}-{count}"
    times = Clock(1000.0), Clock(3600 * 500 + 60.0)
    made = fleet(group, times, count, 0.29, prefix)
    spent = sum(node.spend(3) for node in made)
    watch, promoted = fail_over(group, f"{{{prefix}}}:round")
    try:
        bound = max(29, sum(node.alone_at_most() for node in made))
        while watch.is_alive():
            spent += sum(node.spend(1) for node in made)
    finally:
        watch.join()
    (promotion,) = promoted
    try:
        for node in made:
            wait_until(node.round, FOLLOW_S, f"{node.view.node} on the promoted master {promotion.new_port}")
        for _ in range(40):
            spent += sum(node.spend(1) for node in made)
        for _ in range(3):
            assert all(node.round() for node in made)
        assert spent <= bound, f"{spent} requests on a budget of 29; the stated bound is {bound}"
        held = claims(group, prefix, made[0].lease())
        assert held == {node.view.node: max(node.lease().leased, node.lease().spent) for node in made}
    finally:
        group.rejoin(promotion)


@pytest.mark.parametrize("group", ["cluster"], indirect=True)
def test_every_key_of_a_round_lives_in_the_slot_of_its_hash_tag(group: Group) -> None:
    """On a Cluster a script may touch only keys of one slot: every key Spillway writes carries the
    hash tag ``{prefix}``, so all of them live in that slot, on one master."""
    assert isinstance(group, ClusterGroup)
    times = Clock(1000.0), Clock(3600 * 500 + 60.0)
    made = fleet(group, times, 2, 1.0, "slots")
    for node in made:
        node.spend(5)
    port = group.master_port("{slots}:round")
    assert port is not None
    with redis.Redis(port=port, socket_timeout=2) as master:
        slot = int(master.execute_command("CLUSTER", "KEYSLOT", "{slots}"))
        keys = [k.decode() for k in master.scan_iter(match="{slots}:*")]
        assert len(keys) >= 5, keys
        assert {int(master.execute_command("CLUSTER", "KEYSLOT", k)) for k in keys} == {slot}
        assert int(master.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) == len(keys)
    client: Any = make_client(SharedState(redis_url=group.url))
    try:
        everywhere = client.scan_iter(match="*{slots}*", target_nodes=RedisCluster.ALL_NODES)
        assert {k.decode() for k in everywhere} == set(keys), "no key of a round outside the tag's slot"
    finally:
        client.close()


@pytest.fixture(params=["sentinel", "cluster"])
def steady(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Group]:
    """A group that has not failed over, its failure detectors slow (30 s): a replica stopped or
    cut off stays, for the whole test, one that a failover could promote."""
    if request.param == "sentinel":
        if REDIS_SENTINEL is None:
            pytest.skip(SENTINEL_HINT)
        with sentinel_group(tmp_path / "sentinel", down_after_ms=30_000) as sentinel:
            yield sentinel
    else:
        with cluster_group(tmp_path / "cluster", node_timeout_ms=30_000) as cluster:
            yield cluster


def test_with_replicas_ack_an_answer_waits_for_the_replica_the_master_has(
    steady: Group, tmp_path: Path
) -> None:
    """Replication is asynchronous: a master can answer, then die before its replica has what it
    wrote, and the replica promoted leases it again. With ``replicas_ack`` a node uses an answer
    only once the master's replica holds it: with the replica stopped (SIGSTOP) the master answers,
    but the node decides alone; so too once the master has dropped the link to it (the master no
    longer lists it, as while a replica reconnects, yet the sentinels or the Cluster still would
    promote it). A master with no replica (a lone server) has none to fail over to."""
    group = steady
    times = Clock(1000.0), Clock(3600 * 500 + 60.0)
    shared = {"redis_url": group.url, "nodes_expected": 2, "replicas_ack": 1, "key_prefix": "acked"}
    node = Syncing(config(group.url, shared_state=shared), "node-0", *times)
    assert node.round()
    (replica,) = replicas_of(group, "{acked}:round")
    master = group.master_port() if isinstance(group, SentinelGroup) else group.master_port("{acked}:round")
    assert master is not None
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        assert not node.round(), "no replica holds the round's writes"
        assert not node.view.connected
        with redis.Redis(port=master, socket_timeout=2) as client:
            client.client_kill_filter(_type="slave")
            wait_until(lambda: not client.execute_command("ROLE")[2], 10, "the master without its replica")
        assert not node.round(), "a replica the master lost the link to may still be promoted"
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    wait_until(node.round, FOLLOW_S, "the replica back")
    with redis_server(tmp_path / "redis") as server:
        alone = {"redis_url": server.url, "nodes_expected": 2, "replicas_ack": 1}
        assert Syncing(config(server.url, shared_state=alone), "node-1", *times).round()


def replicas_of(group: Group, key: str) -> list[RedisServer]:
    master = group.master_port() if isinstance(group, SentinelGroup) else group.master_port(key)
    found = []
    for server in group.servers:
        if server.proc is None or server.proc.poll() is not None:
            continue
        with redis.Redis(port=server.port, socket_timeout=2) as client:
            info = client.info("replication")
        if info["role"] == "slave" and int(info["master_port"]) == master:
            found.append(server)
    assert found, f"no replica of the master on {master}"
    return found
