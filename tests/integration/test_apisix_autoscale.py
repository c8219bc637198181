"""An autoscaler's scale-up and scale-down of real tritonservers behind a real Apache APISIX 3.18,
both routes at once, the members found by DNS as a Kubernetes headless Service publishes its pods:
a real dnsmasq whose A records change while traffic runs, each tritonserver on its own loopback
address with the same ports.

Each member runs the ``slow`` model (one instance, 100 ms a request: 10 a second), so
``member_parallelism`` is 1. Eight clients, four a route (three public, one on-prem-only), each
send a request every 200 ms, or when the last is answered if that is later: 40 a second, twice
what two members serve, and never more than eight at once (two a member on four). On two members
public requests spill. Two more members start and, once ready, join the records (a Service
publishes only ready pods): the runner's capacity follows them and the spilled share falls, and
APISIX's own DNS discovery sends to them. They leave the records and stop (scale-down): spilling
resumes. No on-prem-only request ever leaves. Printed: each phase's share, how many scrape periods
after the records changed (the first moment the gateway could reach the new members) the share
fell for good, and the 5xx counts.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field

import pytest

from devtools import apisix
from functions.sidecar import free_port
from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from testing.apisix import example_plugins, gateway_for, needs_apisix
from testing.dns import Dns, dnsmasq, needs_dnsmasq
from testing.http import http, wait_until
from testing.paths import TEST_MODELS
from testing.standins import Upstream, upstream
from testing.tritons import Member

pytestmark = [pytest.mark.integration, needs_apisix(), needs_dnsmasq()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
FAST = "fast.test"
ROUTES = {"ext-plugin": None, "fast path": FAST}
NAME = "triton.inference.svc.cluster.local"
ADDRESSES = [f"127.0.0.{i}" for i in range(2, 6)]
PATH = "/v2/models/slow/infer"
BODY = json.dumps(
    {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "FP32", "data": [100]}]}
).encode()
CLIENTS_PER_ROUTE = 4  # the first of each route's sends on-prem-only requests
SCRAPE_S = 0.25
# Each client sends a request every PACE_S, or as soon as its last is answered if that is later.
PACE_S = 0.2
# The response header the test's routes add: which node APISIX sent a request to.
UPSTREAM_HEADER = "x-test-upstream"
# How long each measured phase runs once settled, and the window a share is read over.
PHASE_S = 3.0
WINDOW_S = 1.0


@dataclass(frozen=True)
class Answer:
    sent: float
    route: str
    public: bool
    status: int
    decision: str
    node: str

    @property
    def spilled(self) -> bool:
        return self.decision.startswith("aws;")


@dataclass
class Load:
    url: str
    aws_node: str
    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[Answer] = field(default_factory=list)

    def client(self, route_name: str, index: int) -> None:
        public = index != 0
        headers = {"content-type": "application/json"}
        if public:
            headers["x-data-classification"] = "public"
        host = ROUTES[route_name]
        if host is not None:
            headers["host"] = host
        sent = float("-inf")
        while not self.stop.wait(max(0.0, sent + PACE_S - time.monotonic())):
            sent = time.monotonic()
            try:
                status, answer, _ = http("POST", self.url, BODY, headers, timeout=60)
            except OSError:
                status, answer = 0, {}
            # With retries the header lists every node tried; the last one answered.
            node = answer.get(UPSTREAM_HEADER, "").split(",")[-1].strip()
            decision = answer.get("x-spillway-decision", "")
            self.answers.append(Answer(sent, route_name, public, status, decision, node))

    def public(self, route_name: str, since: float, until: float = float("inf")) -> list[Answer]:
        return [
            a for a in list(self.answers) if a.route == route_name and a.public and since <= a.sent < until
        ]

    def share(self, route_name: str, since: float, until: float = float("inf")) -> float:
        """The share of ``route_name``'s public requests sent in [since, until) that spilled."""
        public = self.public(route_name, since, until)
        return sum(a.spilled for a in public) / len(public) if len(public) >= 5 else -1.0

    def recent_share(self, route_name: str) -> float:
        return self.share(route_name, time.monotonic() - WINDOW_S)

    def local_nodes(self, route_name: str, since: float) -> set[str]:
        """The members APISIX sent ``route_name``'s requests (public or not) to since ``since``."""
        found = {a.node for a in list(self.answers) if a.route == route_name and a.sent >= since}
        return {n.rpartition(":")[0] for n in found if n and n != self.aws_node}

    def by_scrape(self, route_name: str, since: float, periods: int) -> list[float]:
        """The spilled share of ``route_name``'s public requests sent in each scrape period from
        ``since`` on (-1: none sent in it)."""
        shares = []
        for k in range(periods):
            sent = self.public(route_name, since + k * SCRAPE_S, since + (k + 1) * SCRAPE_S)
            shares.append(round(sum(a.spilled for a in sent) / len(sent), 2) if sent else -1.0)
        return shares

    def fell_after(self, route_name: str, since: float, below: float, held: int = 4) -> int | None:
        """The first scrape period after ``since`` from which the spilled share stayed at most
        ``below`` for ``held`` periods (None: none did)."""
        shares = self.by_scrape(route_name, since, int((time.monotonic() - since) / SCRAPE_S))
        for k in range(len(shares) - held + 1):
            if all(0 <= share <= below for share in shares[k : k + held]):
                return k
        return None


@dataclass
class Cluster:
    gateway: apisix.Apisix
    dns: Dns
    members: list[Member]
    aws: Upstream
    metrics_url: str
    # The on-prem upstream's passive health check: how many failures take a node out.
    unhealthy: dict[str, int]

    def members_up(self) -> float:
        text = http("GET", self.metrics_url, timeout=5)[2].decode()
        found = re.search(r'^spillway_local_members\{state="up"\} (\S+)$', text, re.M)
        return float(found.group(1)) if found else -1.0

    def publish(self, count: int) -> float:
        """The first ``count`` members' records from now on; when they changed."""
        changed = time.monotonic()
        self.dns.set_hosts(NAME, [m.host for m in self.members[:count]])
        return changed


def _stop_all(members: list[Member]) -> None:
    threads = [threading.Thread(target=m.stop) for m in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("apisix-autoscale")
    repo = tmp / "models"
    shutil.copytree(TEST_MODELS / "slow", repo / "slow")
    http_port, metrics_port = free_port(), free_port()
    with ExitStack() as stack:
        dns = stack.enter_context(dnsmasq(tmp))
        members = [
            Member(repo, http_port, metrics_port, repo.parent / f"triton-{a}.log", a) for a in ADDRESSES
        ]
        stack.callback(_stop_all, members)
        for member in members[:2]:
            member.start(wait=False)
        for member in members[:2]:
            member.wait_ready()
        aws = stack.enter_context(upstream("aws", instance="fn-1"))
        config = {
            "local": {
                "discovery": {
                    "dns": {
                        "name": NAME,
                        "port": http_port,
                        "metrics_port": metrics_port,
                        "resolver": dns.resolver,
                        "period_s": SCRAPE_S,
                    }
                },
                "member_parallelism": 1,
                "drop_member_after_s": 0.5,
                "latency_target_ms": 400,
                "scrape_period_s": SCRAPE_S,
                "stale_after_s": 1.0,
            },
            "targets": [
                {"name": "aws", "kind": "http", "url": aws.url, "cold_start_ms": 0, "concurrency_cap": 1000}
            ],
            "metrics": {"listen": f"127.0.0.1:{free_port()}"},
            "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
        }
        validated = SpillwayConfig.model_validate(config)
        tell = {"response-rewrite": {"headers": {"set": {UPSTREAM_HEADER: "$upstream_addr"}}}}
        ext = route(validated, TOKEN)
        fast = fast_route(validated, TOKEN)
        routes = [
            {**ext, "plugins": {**ext["plugins"], **tell}},
            {**fast, "hosts": [FAST], "plugins": {**fast["plugins"], **tell}},
        ]
        dns.set_hosts(NAME, ADDRESSES[:2])
        plugins = [*example_plugins(), "spillway", "response-rewrite"]
        gateway = stack.enter_context(gateway_for(config, tmp, routes, plugins=plugins))
        metrics_url = f"http://{config['metrics']['listen']}/metrics"
        yield Cluster(
            gateway, dns, members, aws, metrics_url, ext["upstream"]["checks"]["passive"]["unhealthy"]
        )


def _node(url: str) -> str:
    return url.removeprefix("http://").rstrip("/")


def _scale(cluster: Cluster, load: Load) -> tuple[dict[str, dict[str, object]], dict[str, dict[str, float]]]:
    """Two members, four, two again, while the load runs: by route, the figures to print and each
    phase's share of public requests spilled."""
    figures: dict[str, dict[str, object]] = {r: {} for r in ROUTES}
    shares: dict[str, dict[str, float]] = {r: {} for r in ROUTES}

    def every_route(check: Callable[[str], bool], what: str, timeout: float = 60) -> None:
        try:
            wait_until(lambda: all(check(r) for r in ROUTES), timeout, what)
        except TimeoutError as exc:
            since = time.monotonic() - WINDOW_S
            now = {r: (load.recent_share(r), sorted(load.local_nodes(r, since))) for r in ROUTES}
            raise TimeoutError(f"{exc} (spilled share and members of the last {WINDOW_S} s: {now})") from None

    def measure(key: str) -> float:
        start = time.monotonic()
        time.sleep(PHASE_S)
        for r in ROUTES:
            shares[r][key] = load.share(r, start, start + PHASE_S)
        return start

    wait_until(lambda: cluster.members_up() == 2, 60, "two members scraped")
    every_route(lambda r: load.recent_share(r) >= 0.4, "public requests spilling on two members")
    start = measure("2 members")
    for r in ROUTES:
        assert load.local_nodes(r, start) <= set(ADDRESSES[:2]), (r, load.local_nodes(r, start))

    for member in cluster.members[2:]:
        member.start(wait=False)
    for member in cluster.members[2:]:
        member.wait_ready()
    joined = cluster.publish(4)
    wait_until(lambda: cluster.members_up() == 4, 30, "four members scraped")
    before = {r: shares[r]["2 members"] for r in ROUTES}
    every_route(lambda r: 0 <= load.recent_share(r) <= before[r] / 2, "the spilled share falling on four")
    every_route(
        lambda r: bool(load.local_nodes(r, time.monotonic() - WINDOW_S) & set(ADDRESSES[2:])),
        "APISIX sending to the new members",
        30,
    )
    start = measure("4 members")
    for r in ROUTES:
        # In scrape periods after the records changed: the first in which the share was at most
        # half what it was, and the first from which it stayed there (APISIX's DNS client may
        # keep sending to the old members only for a moment, which loads them and spills again).
        first, held = load.fell_after(r, joined, before[r] / 2, 1), load.fell_after(r, joined, before[r] / 2)
        figures[r]["fell within (scrape periods)"] = None if first is None else first + 1
        figures[r]["stayed low within (scrape periods)"] = None if held is None else held + 1
        figures[r]["shares by scrape period from joining"] = load.by_scrape(r, joined, 12)
        nodes = load.local_nodes(r, start)
        assert nodes & set(ADDRESSES[2:]) and nodes <= set(ADDRESSES), (r, nodes)

    left = cluster.publish(2)
    stopping = threading.Thread(target=_stop_all, args=(cluster.members[2:],))
    stopping.start()
    every_route(lambda r: load.recent_share(r) >= before[r] / 2, "public requests spilling again on two")
    for r in ROUTES:
        figures[r]["spilling again within (s)"] = round(time.monotonic() - left, 1)
    stopping.join(60)
    wait_until(lambda: cluster.members_up() == 2, 30, "two members scraped again")
    every_route(
        lambda r: load.local_nodes(r, time.monotonic() - WINDOW_S) <= set(ADDRESSES[:2]),
        "APISIX leaving the members that went",
        30,
    )
    for r in ROUTES:
        figures[r]["APISIX left within (s)"] = round(time.monotonic() - left, 1)
    measure("2 members again")
    for r in ROUTES:
        figures[r]["shares"] = {k: round(v, 2) for k, v in shares[r].items()}
    return figures, shares


def test_capacity_and_both_routes_follow_the_members_an_autoscaler_adds_and_removes(cluster: Cluster) -> None:
    aws_node = _node(cluster.aws.url)
    load = Load(cluster.gateway.url + PATH, aws_node)
    with concurrent.futures.ThreadPoolExecutor(len(ROUTES) * CLIENTS_PER_ROUTE) as pool:
        running = [pool.submit(load.client, r, i) for r in ROUTES for i in range(CLIENTS_PER_ROUTE)]
        try:
            figures, shares = _scale(cluster, load)
        finally:
            load.stop.set()
            for future in running:
                future.result()
    answers = list(load.answers)
    failed: dict[str, int] = {}
    for r in ROUTES:
        mine = [a for a in answers if a.route == r]
        failed[r] = sum(a.public and not 0 < a.status < 500 for a in mine)
        figures[r] |= {
            "requests": len(mine),
            "public 5xx": failed[r],
            "on-prem-only 5xx": sum(not a.public and not 0 < a.status < 500 for a in mine),
        }
        print(f"{r}: {figures[r]}")
    onprem = [a for a in answers if not a.public]
    assert onprem and not [a for a in onprem if a.spilled or a.node == aws_node]
    # Every request the cloud stand-in saw is a public one the gateway said it spilled.
    assert len(cluster.aws.seen) == sum(a.spilled for a in answers)
    # A request APISIX sends to a member that has stopped is refused at connect and retried on
    # another node (the upstream's retries). One the stopping Triton fails or drops after taking
    # it is not (a POST), until the passive check counts the node out: at worst one failure short
    # of both its TCP and its HTTP count, then the one that trips it, for each member that left.
    bound = (cluster.unhealthy["tcp_failures"] + cluster.unhealthy["http_failures"] - 1) * 2
    for r in ROUTES:
        got = shares[r]
        assert got["4 members"] <= got["2 members"] / 2, (r, got)
        assert got["2 members again"] >= got["2 members"] / 2, (r, got)
        assert failed[r] <= bound, (r, figures[r], bound)
