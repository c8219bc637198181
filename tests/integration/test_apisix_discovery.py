"""The on-prem members discovered by DNS on a real Apache APISIX 3.18, both routes: APISIX's own DNS
discovery (the route made from ``local.discovery``) and the runner's scrapes follow one membership,
served by a real DNS server (dnsmasq) whose records change while traffic runs, each pod on its own
loopback address as a headless Service's pods are.

Scale-up: two pods, overloaded, every public request spills; two more pods join and the load
spreads (each pod's queue falls): within a few scrape periods public requests stay home, and the
new pods take their share of them. Scale-down likewise, back to spilling.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devtools import apisix
from functions.sidecar import free_port
from testing.apisix import FAST_HOST, both_routes, gateway_for, needs_apisix
from testing.dns import Dns, dnsmasq, needs_dnsmasq, serving_at
from testing.http import QuietHandler, http, wait_until
from testing.standins import MetricsFeed, metrics_handler, upstream

pytestmark = [pytest.mark.integration, needs_apisix(), needs_dnsmasq()]

FAST = FAST_HOST
HOSTS = {"ext-plugin": None, "fast path": FAST}
NAME = "triton.inference.svc.cluster.local"
PODS = [f"127.0.0.{i}" for i in range(2, 6)]


@dataclass
class Pods:
    dns: Dns
    feeds: dict[str, MetricsFeed]
    hits: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def scale(self, count: int, queue_ms: float) -> None:
        """``count`` pods answer to the name from now on, each with ``queue_ms`` of queue."""
        for feed in self.feeds.values():
            feed.queue_ms = queue_ms
        self.dns.set_hosts(NAME, PODS[:count])


def _pod_handler(pods: Pods, address: str) -> type[QuietHandler]:
    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path.startswith("/v2/models/"):
                with pods.lock:
                    pods.hits[address] += 1
            body = json.dumps({"upstream": "local", "pod": address}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    return Handler


@dataclass
class Front:
    gateway: apisix.Apisix
    pods: Pods
    metrics_url: str

    def send(self, host: str | None, classification: str) -> str:
        headers = {"content-type": "application/json", "x-data-classification": classification}
        if host is not None:
            headers["host"] = host
        status, answer, _ = http("POST", self.gateway.url + "/v2/models/add_sub/infer", b"{}", headers)
        assert status == 200, (status, answer)
        return str(answer.get("x-spillway-decision", ""))

    def spilled(self, host: str | None, count: int = 10) -> float:
        return sum(self.send(host, "public").startswith("aws;") for _ in range(count)) / count

    def pods_served(self, each: int) -> set[str]:
        """The pods APISIX sent ``each`` on-prem-only requests per route to."""
        self.pods.hits.clear()
        for host in HOSTS.values():
            for _ in range(each):
                self.send(host, "confidential")
        return set(self.pods.hits)

    def spill_is(self, share: float, host: str | None) -> bool:
        return self.spilled(host, 5) == share

    def members_up(self) -> float:
        text = http("GET", self.metrics_url)[2].decode()
        found = re.search(r'^spillway_local_members\{state="up"\} (\S+)$', text, re.M)
        return float(found.group(1)) if found else -1.0


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    tmp = tmp_path_factory.mktemp("apisix-discovery")
    port, metrics_port = free_port(), free_port()
    with ExitStack() as stack:
        dns = stack.enter_context(dnsmasq(Path(tmp)))
        pods = Pods(dns, {a: MetricsFeed(compute_ms=10) for a in PODS})
        for address in PODS:
            stack.enter_context(serving_at(address, port, _pod_handler(pods, address)))
            stack.enter_context(
                serving_at(address, metrics_port, metrics_handler(pods.feeds[address], content_type=None))
            )
        aws = stack.enter_context(upstream("aws", instance="fn-1"))
        pods.scale(2, queue_ms=500)
        config = {
            "local": {
                "discovery": {
                    "dns": {
                        "name": NAME,
                        "port": port,
                        "metrics_port": metrics_port,
                        "resolver": dns.resolver,
                        "period_s": 0.2,
                    }
                },
                "member_parallelism": 1,
                "latency_target_ms": 200,
                "scrape_period_s": 0.1,
                "stale_after_s": 1.0,
            },
            "targets": [{"name": "aws", "kind": "http", "url": aws.url, "cold_start_ms": 0}],
            "metrics": {"listen": f"127.0.0.1:{free_port()}"},
            "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
        }
        routes = both_routes(config)
        gateway = stack.enter_context(
            gateway_for(config, tmp, routes, fast_path=True, attr={"stale_after_s": 1.0})
        )
        yield Front(gateway, pods, f"http://{config['metrics']['listen']}/metrics")


def test_the_route_and_the_signals_follow_the_pods_the_name_resolves_to(front: Front) -> None:
    for host in HOSTS.values():
        wait_until(functools.partial(front.spill_is, 1.0, host), 30, f"{host} spilling on two pods")
    wait_until(lambda: front.members_up() == 2, 30, "two pods scraped")
    assert front.pods_served(10) == set(PODS[:2]), front.pods.hits

    front.pods.scale(4, queue_ms=20)
    wait_until(lambda: front.members_up() == 4, 30, "four pods scraped")
    for host in HOSTS.values():
        wait_until(functools.partial(front.spill_is, 0.0, host), 30, f"{host} home on four pods")

    def new_pods_served() -> bool:
        served = front.pods_served(20)
        return bool(served & set(PODS[2:])) and served <= set(PODS)

    wait_until(new_pods_served, 30, "APISIX sending to the new pods too")

    front.pods.scale(1, queue_ms=500)
    wait_until(lambda: front.members_up() == 1, 30, "one pod scraped")
    for host in HOSTS.values():
        wait_until(functools.partial(front.spill_is, 1.0, host), 30, f"{host} spilling on one pod")

    def only_the_pod_left() -> bool:
        return front.pods_served(10) == {PODS[0]}

    # APISIX's DNS client may answer from its cache for a few seconds after the records change.
    wait_until(only_the_pod_left, 30, "APISIX leaving the pods that went")
