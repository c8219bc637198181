"""What the shared store keeps across a node's own changes: the fast path's spend and its share of
a cap in the table it publishes, and tenants' quotas across a config reload and across a tenant
forgotten and seen again. One real redis-server, nodes in one process, rounds run by hand.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.fast_path.book import FastPathBook, FastPathReport, apply_outcomes
from gateway_plugin.fast_path.summary import FastOutcomes
from gateway_plugin.policy.snapshot import RequestFeatures
from testing.redis import RedisServer, needs_redis
from tests.integration.test_shared_state import PUBLIC, Clock, Node, config, nodes, server, times

pytestmark = [pytest.mark.integration, needs_redis]
__all__ = ["server", "times"]

ROUTE_TOKEN = "a-route-token-of-some-length"


def tenant(name: str) -> RequestFeatures:
    headers = {"x-data-classification": "public", "x-tenant": name}
    return RequestFeatures("/v2/models/m/infer", headers, {}, "m")


def aws_row(book: FastPathBook, spent: float) -> dict[str, Any]:
    row: dict[str, Any] = json.loads(book.exchange(FastPathReport(node="n1", spent={"aws": spent})))
    return row["targets"]["aws"]


def sent_out(node: Node, features: RequestFeatures, count: int) -> int:
    """Requests sent to the cloud of ``count`` (the others shed, or kept home once a budget is out)."""
    cloud = 0
    for _ in range(count):
        cloud += node.decide(features).is_cloud
        node.sync()
    return cloud


def test_the_fast_paths_spend_reaches_the_table_and_the_other_nodes(
    server: RedisServer, times: tuple[Clock, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", ROUTE_TOKEN)
    cfg = config(server.url, budgets={"per_target_hourly_usd": {"aws": 1.0}})
    a, b = nodes(cfg, times, 2)
    book = FastPathBook(a.state)
    for spent in (0.5, 5.0):
        aws_row(book, spent)
        a.sync()
        row = aws_row(book, spent)
        assert row["spent_hour_usd"] >= min(spent, 1.0), (
            f"the plugin spent ${spent} of a $1 budget; the table says {row['spent_hour_usd']}"
        )
    assert not a.decide().is_cloud, "the budget the fast path spent is spent for the runner too"
    held = b.view.targets["aws"].hour
    assert held is not None
    before = held.leased - held.spent
    spent_on_b = 0
    for _ in range(10):
        b.sync()
        spent_on_b += b.decide().is_cloud
    assert spent_on_b * 0.01 <= before / 1e9, "another node spends what it held, then nothing"


def test_the_table_publishes_the_block_of_slots_the_plugin_may_fill(
    server: RedisServer, times: tuple[Clock, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", ROUTE_TOKEN)
    cfg = config(server.url)  # concurrency_cap 100, three nodes expected: blocks of 100 // 6
    alone = Node(cfg, "alone", *times)
    assert aws_row(FastPathBook(alone.state), 0.0)["cap"] == 16, "away: a block of its cap // nodes"
    three = nodes(cfg, times)
    caps = [aws_row(FastPathBook(node.state), 0.0)["cap"] for node in three]
    for node in three:
        node.sync()
    held = [node.view.targets["aws"].slots.held for node in three]  # type: ignore[union-attr]
    assert caps == [16, 16, 16] and held == [32, 32, 32], f"caps {caps}, slots held {held}"
    assert [aws_row(FastPathBook(node.state), 0.0)["cap"] for node in three] == caps


def test_a_node_serving_both_routes_keeps_the_fast_paths_block_out_of_the_runners_slots(
    server: RedisServer, times: tuple[Clock, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin counts its in-flight requests in APISIX, the runner its own: a node whose table
    lets the plugin fill its block of slots lets the runner fill only the rest, so the two routes
    on one node, and all nodes together, stay under the cap."""
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", ROUTE_TOKEN)
    cfg = config(server.url, shared_state={"redis_url": server.url, "nodes_expected": 2})
    cfg = cfg.model_copy(update={"targets": [cfg.targets[0].model_copy(update={"concurrency_cap": 8})]})
    a, b = nodes(cfg, times, 2)
    fast = aws_row(FastPathBook(a.state), 0.0)["cap"]
    runner = sent_out(a, PUBLIC, 20)
    fast = max(fast, aws_row(FastPathBook(a.state), 0.0)["cap"])
    other = sent_out(b, PUBLIC, 20)
    assert fast == 8 // (2 * 2), "the plugin's block: cap // (2 x nodes)"
    assert runner + fast + other <= 8, f"runner {runner} + plugin {fast} on one node, {other} on the other"


def test_a_node_serving_both_routes_spends_no_unit_of_its_budget_twice(
    server: RedisServer, times: tuple[Clock, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the table lets the plugin spend until its next fetch is kept out of what the runner's
    own decisions may spend meanwhile: the two routes never spend the same unit of a lease."""
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", ROUTE_TOKEN)
    cfg = config(
        server.url,
        budgets={"per_target_hourly_usd": {"aws": 1.0}},
        shared_state={"redis_url": server.url, "nodes_expected": 2},
    )
    a, _ = nodes(cfg, times, 2)
    book = FastPathBook(a.state)
    aws_row(book, 0.0)
    a.sync()  # the node holds slots for both routes now
    plugin_may = 1.0 - aws_row(book, 0.0)["spent_hour_usd"]
    runner = sum(a.decide().is_cloud for _ in range(200)) * 0.01
    lease = a.view.targets["aws"].hour
    assert lease is not None and plugin_may > 0
    assert runner + plugin_may <= lease.leased / 1e9 + 1e-9, (
        f"runner ${runner:.2f} and plugin ${plugin_may:.2f} on a lease of ${lease.leased / 1e9:.2f}"
    )


def test_a_reload_mid_window_keeps_the_tenants_quota(server: RedisServer, times: tuple[Clock, Clock]) -> None:
    cfg = config(server.url, tenants={"quotas": {"t1": {"requests_per_minute": 20, "hourly_usd": 0.3}}})
    (node,) = nodes(cfg, times, 1)
    assert sent_out(node, tenant("t1"), 30) == 20
    node.state.apply(cfg, GatewaySecrets.read(cfg))
    node.sync()
    assert sent_out(node, tenant("t1"), 30) == 0, "same minute, same quota: nothing more"
    times[0].now += 60
    times[1].now += 60
    assert sent_out(node, tenant("t1"), 30) == 10, "a new minute: what is left of $0.30 an hour"
    node.state.apply(cfg, GatewaySecrets.read(cfg))
    node.sync()
    assert sent_out(node, tenant("t1"), 30) == 0, "same hour, same budget: nothing more"


def test_a_tenant_forgotten_and_seen_again_keeps_its_quota(
    server: RedisServer, times: tuple[Clock, Clock]
) -> None:
    cfg = config(server.url, tenants={"max_tracked": 2, "default": {"requests_per_minute": 5}})
    (node,) = nodes(cfg, times, 1)
    assert sent_out(node, tenant("victim"), 10) == 5
    for rotated in range(4):
        sent_out(node, tenant(f"rotated-{rotated}"), 1)
    assert "victim" not in node.view.tenants, "the rotation pushed the tenant out"
    assert sent_out(node, tenant("victim"), 10) == 0, "back in the same minute: still spent"


def test_a_tenants_arrivals_on_the_fast_path_count_on_every_node(
    server: RedisServer, times: tuple[Clock, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", ROUTE_TOKEN)
    cfg = config(server.url, tenants={"quotas": {"t1": {"requests_per_minute": 20, "hourly_usd": 1.0}}})
    a, b = nodes(cfg, times, 2)
    apply_outcomes(a.state, FastOutcomes(tenants={"t1": (20, 0.5)}))
    a.sync()
    row = json.loads(FastPathBook(a.state).exchange(FastPathReport(node="n1")))["tenants"]["t1"]
    assert row["requests_last_minute"] >= 20 and row["spent_hour_usd"] >= 0.5, row
    assert sent_out(b, tenant("t1"), 10) == 0, "the minute's 20 were let in on the other node's fast path"
