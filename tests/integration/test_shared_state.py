"""Several gateways' states sharing one real redis-server, in one process, rounds run by hand.

Each ``Node`` is a ``GatewayState`` with its shared view and a ``RedisStore`` on the same server;
the tests decide with the real policy, run rounds when they choose and move the wall clock
themselves, so what is shared, and when, is exact. The runner processes' own rounds are tested
in test_shared_runners.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from functions.sidecar import free_port
from gateway_plugin.config import ConfigError, SpillwayConfig, parse
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.model import Decision
from gateway_plugin.policy.snapshot import RequestFeatures
from gateway_plugin.shared.view import SharedView
from gateway_plugin.shared_store import RedisStore, make_client
from gateway_plugin.shared_sync import SharedSync
from testing.gateway import gateway_state
from testing.redis import RedisServer, needs_redis, redis_server

pytestmark = [pytest.mark.integration, needs_redis]

PUBLIC = RequestFeatures("/v2/models/m/infer", {"x-data-classification": "public"}, {}, "m")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def config(url: str, **extra: Any) -> SpillwayConfig:
    base: dict[str, Any] = {
        "targets": [
            {
                "name": "aws",
                "kind": "aws_lambda",
                "url": "https://aws.example",
                "concurrency_cap": 100,
                "timeout_s": 30,
                "cost": {"usd_per_request": 0.01, "usd_per_gb_second": 0, "billed_init": False},
            }
        ],
        "rules": [{"name": "out", "action": "target", "targets": ["aws"]}],
        "breaker": {"consecutive_failures": 2, "cooldown_s": 5, "half_open_probes": 1},
        "metrics": {"listen": None},
        "outcomes": {"listen": None},
        "shared_state": {"redis_url": url, "nodes_expected": 3, "lease_share": 0.02},
    }
    for key, value in extra.items():
        base[key] = value
    return SpillwayConfig.model_validate(base)


class Node:
    def __init__(self, cfg: SpillwayConfig, name: str, clock: Clock, wall: Clock) -> None:
        assert cfg.shared_state is not None
        view = SharedView(cfg.shared_state, cfg, build_policy(cfg), name)
        self.state = gateway_state(cfg, clock=clock, wall=wall, shared=view)
        self.view = view
        self.store = RedisStore(cfg.shared_state)

    def sync(self) -> None:
        sent = self.state.shared_round()
        self.state.shared_answered(sent, self.store.exchange(sent.payload))
        self.view.connected = True

    def decide(self, features: RequestFeatures = PUBLIC) -> Decision:
        snapshot = self.state.snapshot(features.headers.get("x-tenant"), "m")
        decision = decide(features, snapshot, self.state.policy)
        self.state.commit(decision, "m")
        return decision


@pytest.fixture
def server(tmp_path: Path) -> Any:
    with redis_server(tmp_path / "redis") as running:
        yield running


@pytest.fixture
def times() -> tuple[Clock, Clock]:
    return Clock(1000.0), Clock(3600 * 500 + 60.0)


def nodes(cfg: SpillwayConfig, times: tuple[Clock, Clock], count: int = 3) -> list[Node]:
    made = [Node(cfg, f"node-{i}", *times) for i in range(count)]
    for node in made:
        node.sync()
    return made


def test_three_nodes_spend_the_hourly_budget_once(server: RedisServer, times: tuple[Clock, Clock]) -> None:
    cfg = config(server.url, budgets={"per_target_hourly_usd": {"aws": 1.0}})
    three = nodes(cfg, times)
    cloud = 0
    for turn in range(600):
        node = three[turn % 3]
        cloud += node.decide().is_cloud
        if turn % 7 == 0:
            node.sync()
    for _ in range(3):
        for node in three:
            node.sync()
            while node.decide().is_cloud:
                cloud += 1
    block = 2  # lease_share 0.02 of $1 at $0.01 a request
    assert 100 - 3 * block <= cloud <= 100, "never more than the budget; at most a block per node unused"
    granted = redis.Redis(port=server.port).hgetall("{spillway}:lease:target:aws:spend:h:" + str(500))
    assert sum(int(v) for v in granted.values()) <= 1_000_000_000


def test_a_round_sent_twice_counts_its_claims_once(server: RedisServer, times: tuple[Clock, Clock]) -> None:
    cfg = config(server.url, budgets={"per_target_hourly_usd": {"aws": 1.0}})
    (node,) = nodes(cfg, times, 1)
    node.view.connected = False
    times[1].now += cfg.shared_state.node_ttl_ms / 1000  # type: ignore[union-attr]
    spent_alone = sum(node.decide().is_cloud for _ in range(20))
    assert spent_alone == 20, "alone and forgotten: a third of the budget and of the cap (33)"
    sent = node.state.shared_round()
    node.store.exchange(sent.payload)  # the answer is lost
    node.state.shared_answered(sent, node.store.exchange(sent.payload))
    field = redis.Redis(port=server.port).hget("{spillway}:lease:target:aws:spend:h:500", "node-0")
    lease = node.view.targets["aws"].hour
    assert lease is not None and lease.spent == 20 * 10_000_000
    assert int(field or 0) == lease.leased, "the node learns every grant, lost answers included"
    assert lease.leased <= lease.spent + 2 * lease.block, "the claim of 20 requests was not doubled"


def test_a_global_concurrency_cap_holds_across_nodes(server: RedisServer, times: tuple[Clock, Clock]) -> None:
    cfg = config(server.url)
    cfg = cfg.model_copy(update={"targets": [cfg.targets[0].model_copy(update={"concurrency_cap": 5})]})
    three = nodes(cfg, times)
    sent = [0, 0, 0]
    for turn in range(300):
        i = turn % 3
        sent[i] += three[i].decide().is_cloud
        three[i].sync()
    assert sum(sent) == 5, f"unanswered requests per node {sent}"
    busiest = max(range(3), key=lambda i: sent[i])
    for _ in range(sent[busiest]):
        three[busiest].state.answered("aws", None, ok=True, seconds=0.1)
    three[busiest].sync()
    other = (busiest + 1) % 3
    three[other].sync()
    assert three[other].decide().is_cloud, "slots freed on one node are taken by another"


def test_a_node_that_loses_the_store_fills_no_slot_the_store_counts_for_another(
    server: RedisServer, times: tuple[Clock, Clock]
) -> None:
    """Two nodes on a cap of 4, one holding 3 slots (all busy) and the other 1: the second's round
    fails (a late answer is one). While the store still counts the first's 3 slots, the second
    fills only what the store counts for it, not its share (2), and no more while it settles on
    coming back; once the store has forgotten it (its node key expired), its share."""
    cfg = config(server.url, shared_state={"redis_url": server.url, "nodes_expected": 2})
    cfg = cfg.model_copy(update={"targets": [cfg.targets[0].model_copy(update={"concurrency_cap": 4})]})
    busy, other = nodes(cfg, times, 2)
    sent = 0
    for _ in range(6):
        sent += busy.decide().is_cloud
        busy.sync()
    other.sync()
    assert sent == 3 and other.decide().is_cloud and not other.decide().is_cloud
    other.view.connected = False
    assert not other.decide().is_cloud, "3 + 1 counted, all busy: full"
    other.sync()
    assert other.view.comeback.back is not None, "back, not settled yet"
    assert not other.decide().is_cloud, "the store holds it 1 slot, busy"
    other.state.answered("aws", None, ok=True, seconds=0.1)
    assert other.decide().is_cloud and not other.decide().is_cloud
    other.view.connected = False
    _, wall = times
    wall.now += cfg.shared_state.node_ttl_ms / 1000 + 1  # type: ignore[union-attr]
    assert sum(other.decide().is_cloud for _ in range(3)) == 1, "forgotten: its share of the cap (2)"


def test_a_breaker_opened_on_one_node_is_open_on_all_then_one_probe_closes_it(
    server: RedisServer, times: tuple[Clock, Clock]
) -> None:
    clock, wall = times
    a, b, c = nodes(config(server.url), times)
    assert b.decide().is_cloud
    for _ in range(2):
        a.state.answered("aws", None, ok=False)
    assert not a.decide().is_cloud, "open here at once, before any round"
    assert b.decide().is_cloud, "the others do not know yet"
    a.sync()
    b.sync()
    c.sync()
    assert not b.decide().is_cloud and not c.decide().is_cloud, "open everywhere after one round"
    clock.now += 5
    wall.now += 5
    for node in (a, b, c):
        node.sync()
    probes = [node.decide().is_cloud for node in (a, b, c) for _ in range(3)]
    assert probes.count(True) == 1, "one probe for all three nodes (half_open_probes: 1)"
    prober = (a, b, c)[probes.index(True) // 3]
    prober.state.answered("aws", None, ok=True)
    for node in (prober, a, b, c):
        node.sync()
    assert all(node.decide().is_cloud for node in (a, b, c)), "the probe's success closed it for all"


def test_a_failed_probe_reopens_for_all_with_a_doubled_cooldown(
    server: RedisServer, times: tuple[Clock, Clock]
) -> None:
    clock, wall = times
    a, b = nodes(config(server.url), times, 2)
    for _ in range(2):
        a.state.answered("aws", None, ok=False)
    a.sync()
    wall.now += 5
    clock.now += 5
    a.sync()
    assert a.decide().is_cloud, "the probe"
    a.state.answered("aws", None, ok=False)
    a.sync()
    b.sync()
    assert b.view.breakers["aws"].cooldown_ms == 10_000
    wall.now += 9.9
    b.sync()
    assert not b.decide().is_cloud


def test_store_gone_and_back(server: RedisServer, times: tuple[Clock, Clock]) -> None:
    """Redis killed: rounds fail fast, the node keeps deciding with its third of the budget; Redis
    back, empty: the node claims what it spent alone, once."""
    cfg = config(server.url, budgets={"per_target_hourly_usd": {"aws": 0.3}})
    (node,) = nodes(cfg, times, 1)
    sync = SharedSync(node.state, node.store, period_s=0.1, timeout_s=0.5)

    async def run() -> None:
        assert await sync.round()
        assert node.view.connected
        server.stop()
        assert not await sync.round()
        assert not node.view.connected and sync.metrics.shared_connected._value.get() == 0
        cloud = sum(node.decide().is_cloud for _ in range(50))
        lease = node.view.targets["aws"].hour
        assert lease is not None
        assert cloud == (lease.leased + (lease.limit - lease.total) // 3) // 10_000_000
        server.start()
        assert await sync.round()
        assert node.view.connected and sync.metrics.shared_connected._value.get() == 1
        field = redis.Redis(port=server.port).hget("{spillway}:lease:target:aws:spend:h:500", "node-0")
        assert int(field or 0) >= cloud * 10_000_000
        assert int(field or 0) <= cloud * 10_000_000 + lease.block

    asyncio.run(run())


def test_the_password_comes_from_the_environment_and_never_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        redis.Redis(port=server.port).config_set("requirepass", "s3cret-pw-123")
        cfg = config(server.url)
        assert cfg.shared_state is not None
        monkeypatch.setenv("SPILLWAY_REDIS_PASSWORD", "wrong-pw-456")
        store = RedisStore(cfg.shared_state)
        with pytest.raises(redis.RedisError) as caught:
            store.exchange({"p": "{x}"})
        assert "wrong-pw-456" not in store.describe(caught.value)
        monkeypatch.setenv("SPILLWAY_REDIS_PASSWORD", "s3cret-pw-123")
        assert make_client(cfg.shared_state).ping()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("url", "wrong"),
    [
        ("redis://:hunter2@127.0.0.1:6379/0", "credentials do not belong in the URL"),
        ("http://127.0.0.1:6379", "the scheme must be one of"),
        ("redis://", "names no host"),
    ],
)
def test_bad_urls_are_refused_without_echoing_them(url: str, wrong: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"shared_state": {"redis_url": url}})
    assert "shared_state.redis_url" in str(caught.value) and wrong in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_sentinel_and_cluster_urls_are_understood() -> None:
    cfg = parse({"shared_state": {"redis_url": "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/main/2"}})
    assert cfg.shared_state is not None
    client = make_client(cfg.shared_state, {})
    assert client.connection_pool.service_name == "main"
    assert client.connection_pool.connection_kwargs["db"] == 2
    missing_master = parse({"shared_state": {"redis_url": "redis+sentinel://h:26379"}}).shared_state
    assert missing_master is not None
    with pytest.raises(ValueError, match="names its master"):
        RedisStore(missing_master)
    with pytest.raises(ValueError, match="is not host:port"):
        RedisStore(parse({"shared_state": {"redis_url": "redis+cluster://h1:7000,h2"}}).shared_state)  # type: ignore[arg-type]


def test_a_cluster_away_at_start_is_a_failed_round_not_a_failed_start(times: tuple[Clock, Clock]) -> None:
    """A Cluster client reaches its nodes when it is made: that happens in the first round."""
    cfg = config(f"redis+cluster://127.0.0.1:{free_port()}")
    assert cfg.shared_state is not None
    store = RedisStore(cfg.shared_state)
    view = SharedView(cfg.shared_state, cfg, build_policy(cfg), "node-0")
    state = gateway_state(cfg, clock=times[0], wall=times[1], shared=view)
    sync = SharedSync(state, store, period_s=0.1, timeout_s=5)
    assert not asyncio.run(sync.round())
    assert not view.connected
    assert decide(PUBLIC, state.snapshot(None, "m"), state.policy).is_cloud, "deciding alone"


def test_check_config_explains_shared_state_without_its_password(tmp_path: Path) -> None:
    path = tmp_path / "spillway.yaml"
    path.write_text("shared_state: {redis_url: 'rediss://redis.internal:6380/1', nodes_expected: 4}\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "check-config", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "SPILLWAY_REDIS_PASSWORD": "pw-that-must-not-show"},
        check=True,
    )
    assert "rediss://redis.internal:6380/1" in done.stdout and "1/4 of every budget" in done.stdout
    assert "pw-that-must-not-show" not in done.stdout + done.stderr


@pytest.mark.parametrize(("quota", "limit"), [({"requests_per_minute": 30}, 30), ({"concurrency": 4}, 4)])
def test_a_tenant_quota_holds_across_nodes(
    server: RedisServer, times: tuple[Clock, Clock], quota: dict[str, int], limit: int
) -> None:
    cfg = config(server.url, tenants={"quotas": {"t1": quota}})
    three = nodes(cfg, times)
    tenant = RequestFeatures(
        "/v2/models/m/infer", {"x-data-classification": "public", "x-tenant": "t1"}, {}, "m"
    )
    admitted = 0
    for turn in range(300):
        node = three[turn % 3]
        decision = node.decide(tenant)
        admitted += decision.status != 429
        node.sync()
    assert limit - 3 * 2 <= admitted <= limit, (
        f"{admitted} admitted of a quota of {limit} shared by three nodes"
    )
    if "requests_per_minute" in quota:
        times[0].now += 60
        times[1].now += 60
        again = 0
        for turn in range(30):
            node = three[turn % 3]
            again += node.decide(tenant).status != 429
            node.sync()
        assert again > 0, "a new minute: the tenant, shed until now, is let in again"


def test_instances_seen_by_one_node_count_as_warm_on_the_others(
    server: RedisServer, times: tuple[Clock, Clock]
) -> None:
    a, b = nodes(config(server.url), times, 2)
    clock, wall = times

    def free_warm(node: Node) -> int:
        """What the policy reads: warm instances beyond those busy (it compares the two)."""
        state = node.state.target_state("aws", clock.now, wall.now)
        return state.warm_instances - state.in_flight

    assert free_warm(b) == 0
    a.state.answered("aws", None, ok=True, instance="i-1", seconds=0.1)
    a.state.warm_report("aws", ["i-2", "i-3"])
    a.sync()
    b.sync()
    assert b.view.warm["aws"] == 3
    assert free_warm(b) == 3, "none busy: all three free"
    assert b.decide().reason.value == "overflow_warm"
    b.sync()
    a.sync()
    assert free_warm(a) == 2, "one now busy, seen from the other node"
    wall.now += 301  # the target's idle TTL (300 s) passed
    b.sync()
    assert b.view.warm["aws"] == 0


def test_a_slow_store_is_left_after_its_timeout_and_taken_back_when_it_answers(
    server: RedisServer, times: tuple[Clock, Clock]
) -> None:
    """redis-server stopped (SIGSTOP), as a store too slow to answer: the round gives up after
    ``timeout_ms``, the node decides alone; resumed, the next round reconnects."""
    (node,) = nodes(config(server.url, budgets={"per_target_hourly_usd": {"aws": 0.3}}), times, 1)
    sync = SharedSync(node.state, node.store, period_s=0.1, timeout_s=0.3)
    assert server.proc is not None

    async def run() -> None:
        assert await sync.round()
        server.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            assert not await sync.round()
            assert not node.view.connected
            assert node.decide().is_cloud, "alone, with its share"
            assert not await sync.round(), "the call still out: no second one piled on it"
        finally:
            server.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        assert await sync.drained(30)
        assert await sync.round()
        assert node.view.connected

    asyncio.run(run())


@pytest.mark.parametrize("timeout_s", [0.1, 0.3], ids=["round-deadline", "client-timeout"])
def test_a_late_round_keeps_the_node_to_what_the_store_counts_for_it(
    server: RedisServer, times: tuple[Clock, Clock], timeout_s: float
) -> None:
    """A round that times out (the round's deadline, or first the client's ``timeout_ms`` of
    0.2 s) may still run on the store and renew the node there: the node fills no more than it
    held (16 slots) for the node TTL after that round was sent, not after its last answered one;
    then its share of the cap (33)."""
    (node,) = nodes(config(server.url), times, 1)
    sync = SharedSync(node.state, node.store, period_s=0.1, timeout_s=timeout_s)
    wall, ttl_s = times[1], node.view.settings.node_ttl_ms / 1000
    assert server.proc is not None

    async def run() -> None:
        assert await sync.round()
        held = node.view.cap("aws", wall.now)
        wall.now += ttl_s - 1
        server.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            assert not await sync.round()
        finally:
            server.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        wall.now += 2
        assert node.view.cap("aws", wall.now) == held == 16, "the late round may have run"
        wall.now += ttl_s
        assert node.view.cap("aws", wall.now) == 33, "forgotten: its share"
        assert await sync.drained(30)

    asyncio.run(run())


class GarbledStore:
    """A store whose answers do not fit the request: stands in for a broken or foreign server,
    which a real redis-server running this project's script cannot be made into."""

    def __init__(self) -> None:
        self.calls = 0
        self.third = threading.Event()

    def exchange(self, payload: dict[str, Any]) -> list[Any]:
        self.calls += 1
        if self.calls >= 3:
            self.third.set()
        return [[], [], [], []]

    def describe(self, error: BaseException) -> str:
        return type(error).__name__

    def may_have_run(self, error: BaseException) -> bool:
        return False

    def close(self) -> None:
        pass


def test_an_answer_that_cannot_be_applied_does_not_end_the_rounds(times: tuple[Clock, Clock]) -> None:
    cfg = config("redis://127.0.0.1:1/0")
    assert cfg.shared_state is not None
    view = SharedView(cfg.shared_state, cfg, build_policy(cfg), "node-0")
    state = gateway_state(cfg, clock=times[0], wall=times[1], shared=view)
    store = GarbledStore()
    sync = SharedSync(state, store, period_s=0.01, timeout_s=1)

    async def run() -> None:
        task = asyncio.ensure_future(sync.run())
        assert await asyncio.to_thread(store.third.wait, 30), "a third round came"
        assert not task.done(), "the rounds go on"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    assert not view.connected
