"""Two real APISIX 3.18 nodes in APISIX's traditional deployment: one real etcd holds the routes,
put there through the Admin API by ``apisix-route --push`` (the key from the environment); each
node runs its own runner (its ext-plugin route) and the fast path, and the two runners share one
hourly budget and one concurrency cap through Redis: a single redis-server, a Sentinel group and a
Redis Cluster, whose master is killed while traffic goes through both nodes and both routes.

What is checked is what docs/deploying/multi-node.md states: no request goes unanswered while the
store fails over; both runners find the promoted replica within 10 s of the promotion; the cap holds
throughout; the budget holds while Redis answers and, across the failover, within the stated bound
(the budget, or the sum of what each runner's last answered round let it spend alone, which it
publishes as ``spillway_shared_state_alone_usd``); each request's spend counted once.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.etcd import ETCD, ETCD_HINT
from devtools.nodes import ADMIN_KEY_ENV, Node, Nodes, nodes_running
from devtools.redis_ha import REDIS_SENTINEL, SENTINEL_HINT, ClusterGroup, Promotion, SentinelGroup
from gateway_plugin.apisix_admin import DEFAULT_KEYS
from testing.apisix import needs_apisix
from testing.budget import clear_of_the_hours_end
from testing.http import http, wait_until
from testing.redis import needs_redis, redis_server
from testing.standins import StandIns

pytestmark = [
    pytest.mark.integration,
    needs_apisix(),
    needs_redis,
    pytest.mark.skipif(ETCD is None, reason=ETCD_HINT),
]

COST_USD = 0.01
BUDGET_REQUESTS = 100
CAP = 4
# docs/deploying/multi-node.md: a block and a half (of 2 requests) a runner holds, and the block
# kept for its plugin.
UNUSED_PER_NODE = 5
# docs/deploying/multi-node.md: each runner finds the promoted replica within 10 s of the promotion.
FOLLOW_S = 10.0
ROUTES = ("/v2/models/add_sub/infer", "/fast/v2/models/add_sub/infer")


@pytest.fixture(scope="module")
def upstreams(module_stand_ins: StandIns) -> StandIns:
    module_stand_ins.aws.delay_s = 0.02  # answers take a while: the cap has requests to hold back
    return module_stand_ins


def node_config(up: StandIns, store_url: str, replicas_ack: int = 0) -> dict[str, Any]:
    """One node's spillway.yaml: every public request to aws (a rule), $0.01 each, an hourly budget
    of 100 of them and a cap of 4 in flight shared by both nodes; its own metrics and outcome ports."""
    made = up.config()
    made["targets"][0]["concurrency_cap"] = CAP
    made["targets"][0]["cost"] = {"usd_per_request": COST_USD, "usd_per_gb_second": 0, "billed_init": False}
    made["budgets"] = {"per_target_hourly_usd": {"aws": BUDGET_REQUESTS * COST_USD}}
    made["rules"] = [{"name": "out", "action": "target", "targets": ["aws"]}]
    made["shared_state"] = {
        "redis_url": store_url,
        "nodes_expected": 2,
        "key_prefix": secrets.token_hex(4),
        "replicas_ack": replicas_ack,
    }
    return made


@contextmanager
def two_nodes(tmp: Path, up: StandIns, store_url: str, replicas_ack: int = 0) -> Iterator[Nodes]:
    key = secrets.token_hex(24)
    configs = [node_config(up, store_url, replicas_ack) for _ in range(2)]
    prefix = configs[0]["shared_state"]["key_prefix"]
    for config in configs:
        config["shared_state"]["key_prefix"] = prefix
    up.aws.seen.clear()
    with nodes_running(tmp, configs, key) as nodes:
        nodes.push_routes()
        for node in nodes.nodes:
            for path in ROUTES:
                wait_routed(node, path)
            wait_until(lambda n=node: metric(n, "spillway_shared_state_connected") == 1, 30, "Redis")  # type: ignore[misc]
        up.aws.max_in_flight = 0
        yield nodes


def wait_routed(node: Node, path: str, timeout_s: float = 30) -> None:
    """Until a public request on ``path`` is answered by aws; else what the last one got."""
    deadline, last = time.monotonic() + timeout_s, (0, "", "")
    while time.monotonic() < deadline:
        last = send(node, path)
        if last[:2] == (200, "aws"):
            return
        time.sleep(0.02)
    raise TimeoutError(f"{path} on {node.name} not routed to aws within {timeout_s} s: last {last}")


def send(node: Node, path: str, classification: str = "public") -> tuple[int, str, str]:
    """(status, the upstream that answered, the decision)."""
    headers = {"content-type": "application/json", "x-data-classification": classification}
    status, answer, body = http("POST", node.url + path, b"{}", headers, timeout=30)
    upstream_name = json.loads(body).get("upstream", "") if body.startswith(b"{") else ""
    return status, upstream_name, answer.get("x-spillway-decision", "")


def metric(node: Node, name: str, **labels: str) -> float:
    try:
        _, _, body = http("GET", node.metrics_url, timeout=5)
    except OSError:
        return -1.0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


@dataclass
class Traffic:
    """Clients on both nodes and both routes, one request at a time each, until stopped."""

    nodes: Nodes
    per_route: int = 1
    paths: tuple[str, ...] = ROUTES
    answers: Counter[tuple[int, str]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for node in self.nodes.nodes:
            for path in self.paths:
                for _ in range(self.per_route):
                    thread = threading.Thread(target=self._client, args=(node, path), daemon=True)
                    thread.start()
                    self.threads.append(thread)

    def _client(self, node: Node, path: str) -> None:
        while not self.stop.is_set():
            status, answered_by, _ = send(node, path)
            with self.lock:
                self.answers[status, answered_by] += 1

    def count(self, upstream_name: str) -> int:
        with self.lock:
            return sum(n for (_, name), n in self.answers.items() if name == upstream_name)

    def finish(self) -> Counter[tuple[int, str]]:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        return self.answers


def after_rounds(nodes: Nodes, count: int) -> None:
    """Until every runner has completed ``count`` more rounds with the shared store."""
    name = "spillway_shared_state_rounds_total"
    for node in nodes.nodes:
        seen = metric(node, name)
        wait_until(lambda n=node, s=seen: metric(n, name) >= s + count, 30, "shared-state rounds")  # type: ignore[misc]


def spent_requests(nodes: Nodes) -> float:
    """What the runners counted as spent on aws, in requests (both routes)."""
    return sum(metric(n, "spillway_cloud_spend_usd_total", target="aws") for n in nodes.nodes) / COST_USD


def test_routes_put_through_the_admin_api_serve_both_nodes(tmp_path: Path, upstreams: StandIns) -> None:
    """One push reaches both nodes (the second has no Admin API of its own: each node and route
    sent a request to aws as ``two_nodes`` started); the Admin API takes no default key, and the
    push reads its key only from the environment, never echoing it."""
    with redis_server(tmp_path / "redis") as server, two_nodes(tmp_path, upstreams, server.url) as nodes:
        for node in nodes.nodes:
            for path in ROUTES:
                status, answered_by, decision = send(node, path, "confidential")
                assert (status, answered_by, decision) == (200, "local", "local;residency")
        default = sorted(DEFAULT_KEYS)[0]
        listed = urllib.request.Request(
            nodes.admin_url + "/apisix/admin/routes", headers={"X-API-KEY": default}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(listed, timeout=10)
        assert refused.value.code == 401
        first = nodes.nodes[0]
        for key, says in ((default, "documented default"), ("x" + nodes.admin_key, "answered 401")):
            with pytest.raises(RuntimeError, match=says) as failed:
                Nodes(nodes.etcd, nodes.nodes, nodes.admin_url, key).push(first, "--id", "other")
            assert nodes.admin_key not in str(failed.value)
        written = (first.gateway.home / "conf" / "config.yaml").read_text()
        assert "${{" + ADMIN_KEY_ENV + "}}" in written and nodes.admin_key not in written
        for node in nodes.nodes:
            assert nodes.admin_key not in node.gateway.error_log()


@pytest.mark.parametrize("routes", [ROUTES, ROUTES[1:]], ids=["both-routes", "fast-path-alone"])
def test_one_budget_and_one_cap_across_two_nodes(
    tmp_path: Path, upstreams: StandIns, routes: tuple[str, ...]
) -> None:
    """Traffic over both nodes (both routes, or the fast path alone, whose plugin spends the budget
    a block a table): aws gets the budget's requests and no more (less what may stay leased and
    unused: ``UNUSED_PER_NODE`` a node), never more than the cap at once, and the runners count
    each request's spend once."""
    clear_of_the_hours_end(90)
    with redis_server(tmp_path / "redis") as server, two_nodes(tmp_path, upstreams, server.url) as nodes:
        traffic = Traffic(nodes, per_route=2, paths=routes)
        traffic.start()
        least = BUDGET_REQUESTS - 2 * UNUSED_PER_NODE
        wait_until(lambda: spent_requests(nodes) >= least, 60, "the budget spent")
        after_rounds(nodes, 4)
        traffic.finish()
        after_rounds(nodes, 2)
        spent = spent_requests(nodes)
        late = [metric(n, "spillway_shared_state_errors_total") for n in nodes.nodes]
    answers, aws = traffic.answers, len(upstreams.aws.seen)
    assert {status for status, _ in answers} == {200}, answers
    assert BUDGET_REQUESTS - 2 * UNUSED_PER_NODE <= aws <= BUDGET_REQUESTS, answers
    assert spent == pytest.approx(aws)
    assert 0 < upstreams.aws.max_in_flight <= CAP, f"rounds failed or late on each node: {late}"


@contextmanager
def store(kind: str, folder: Path) -> Iterator[SentinelGroup | ClusterGroup]:
    if kind == "sentinel" and REDIS_SENTINEL is None:
        pytest.skip(SENTINEL_HINT)
    group = SentinelGroup(folder) if kind == "sentinel" else ClusterGroup(folder)
    try:
        group.start()
        yield group
    finally:
        group.stop()


def kill_master(group: SentinelGroup | ClusterGroup, prefix: str) -> tuple[threading.Thread, list[Promotion]]:
    """SIGKILL the master holding the runners' keys; its replica's promotion awaited on a thread."""
    done: list[Promotion] = []
    if isinstance(group, SentinelGroup):
        old = group.master_port()
        assert old is not None
        killed_at = group.kill_master()
        watch = threading.Thread(target=lambda: done.append(group.wait_promotion(old, killed_at)))
    else:
        key = f"{{{prefix}}}:round"
        old, killed_at = group.kill_master(key)
        watch = threading.Thread(target=lambda: done.append(group.wait_promotion(key, old, killed_at)))
    watch.start()
    return watch, done


@pytest.mark.parametrize("kind", ["sentinel", "cluster"])
def test_a_master_killed_mid_traffic_stops_no_request_and_keeps_the_bounds(
    tmp_path: Path, upstreams: StandIns, kind: str
) -> None:
    """Traffic over both nodes and both routes; after 20 requests reached aws, the master holding
    the runners' keys is killed. Every request is answered all along; both runners go alone, then
    find the promoted replica within 10 s; aws never has more than the cap in flight, and gets at
    most the stated bound: the budget, or what the runners' last answered rounds let them spend
    alone, together; each request's spend counted once."""
    clear_of_the_hours_end(90)
    with store(kind, tmp_path / kind) as group, two_nodes(tmp_path, upstreams, group.url, 1) as nodes:
        prefix = nodes.nodes[0].config["shared_state"]["key_prefix"]
        traffic = Traffic(nodes)
        traffic.start()
        wait_until(lambda: len(upstreams.aws.seen) >= 20, 60, "20 requests to aws")
        watch, promoted = kill_master(group, prefix)
        for node in nodes.nodes:
            wait_until(lambda n=node: metric(n, "spillway_shared_state_connected") == 0, 30, "alone")  # type: ignore[misc]
        alone = sum(
            metric(n, "spillway_shared_state_alone_usd", target="aws", window="hour") for n in nodes.nodes
        )
        answered_before = sum(traffic.answers.values())
        watch.join()
        assert len(promoted) == 1, "the replica promoted"
        answered_during = sum(traffic.answers.values()) - answered_before
        for node in nodes.nodes:
            back = lambda n=node: metric(n, "spillway_shared_state_connected") == 1  # noqa: E731
            wait_until(back, FOLLOW_S, f"{node.name} on the promoted master")
        after_rounds(nodes, 10)
        answers = traffic.finish()
        after_rounds(nodes, 2)
        spent = spent_requests(nodes)
    aws = len(upstreams.aws.seen)
    bound = max(BUDGET_REQUESTS, int(alone / COST_USD + 1e-6))
    assert {status for status, _ in answers} == {200}, answers
    assert answered_during > 0, "requests answered while the store failed over"
    assert aws <= bound, (
        f"{aws} requests to aws on a budget of {BUDGET_REQUESTS}; the stated bound is {bound}"
    )
    assert spent == pytest.approx(aws)
    assert 0 < upstreams.aws.max_in_flight <= CAP
