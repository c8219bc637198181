"""A wedged on-prem member on a real Apache APISIX 3.18, both routes: three real tritonservers, one of
which starts failing every request (503, as a model on a hung GPU does) while its metrics and its
readiness keep answering.

Before, a member counted as capacity for as long as its metrics page answered, and a wedged one even
looked idle (nothing queued, nothing computed). Now the answers APISIX reports, each naming the
node it went to, take it out of the capacity the policy reads (``spillway_local_capacity``) and
show it as ``wedged``; it counts again once it answers. No on-prem-only request leaves; the
requests APISIX sent the wedged member before its health checks took it out (and each time
Triton's readiness brought it back) fail, and are printed.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field

import pytest

from devtools import apisix
from functions.sidecar import free_port
from testing.apisix import FAST_HOST, both_routes, gateway_for, needs_apisix
from testing.http import http, wait_until
from testing.paths import TEST_MODELS
from testing.standins import upstream
from testing.tritons import Member

pytestmark = [pytest.mark.integration, needs_apisix()]

FAST = FAST_HOST
PATH = "/v2/models/slow/infer"
CLIENTS = 6
BODY = json.dumps({"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "FP32", "data": [20]}]}).encode()


@dataclass
class Wedged:
    gateway: apisix.Apisix
    members: list[Member]
    metrics_url: str

    def metric(self, name: str) -> float:
        _, _, text = http("GET", self.metrics_url, None, {}, timeout=10)
        found = re.search(rf"^{re.escape(name)} (\S+)$", text.decode(), re.M)
        return float(found.group(1)) if found else -1.0

    def seen(self) -> list[str]:
        """What the gateway shows of the members and the cluster's health, for a failure's message."""
        _, _, text = http("GET", self.metrics_url, None, {}, timeout=10)
        wanted = ("spillway_local_members", "spillway_local_capacity", "spillway_local_failing")
        return [line for line in text.decode().splitlines() if line.startswith(wanted)]

    def wedge(self, member: int, wedged: bool) -> None:
        flag = self.members[member].repo / "slow" / "wedged"
        if wedged:
            flag.touch()
        else:
            flag.unlink()


@dataclass
class Traffic:
    """Requests one after another, public and on-prem-only in turn, until stopped (a thread each)."""

    url: str
    host: str | None
    stop: threading.Event = field(default_factory=threading.Event)
    seen: list[tuple[bool, int, str]] = field(default_factory=list)

    def run(self) -> None:
        public = threading.get_ident() % 2 == 0
        while not self.stop.is_set():
            public = not public
            headers = {"content-type": "application/json"}
            if public:
                headers["x-data-classification"] = "public"
            if self.host is not None:
                headers["host"] = self.host
            status, answer, _ = http("POST", self.url, BODY, headers, timeout=60)
            self.seen.append((public, status, answer.get("x-spillway-decision", "")))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wedged]:
    tmp = tmp_path_factory.mktemp("apisix-wedged")
    with ExitStack() as stack:
        members = []
        for index in range(3):
            repo = tmp / f"models-{index}"  # each its own, so one alone can be wedged
            shutil.copytree(TEST_MODELS / "slow", repo / "slow")
            member = Member(repo)
            member.start()
            stack.callback(member.stop)
            members.append(member)
        aws = stack.enter_context(upstream("aws", instance="fn-1"))
        metrics = f"127.0.0.1:{free_port()}"
        config = {
            "local": {
                "endpoints": [
                    {
                        "url": f"http://127.0.0.1:{m.http_port}",
                        "metrics_url": f"http://127.0.0.1:{m.metrics_port}/metrics",
                    }
                    for m in members
                ],
                "member_parallelism": 1,
                "latency_target_ms": 400,
                "scrape_period_s": 0.2,
            },
            "targets": [
                {"name": "aws", "kind": "http", "url": aws.url, "cold_start_ms": 0, "concurrency_cap": 1000}
            ],
            "metrics": {"listen": metrics},
            "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
        }
        gateway = stack.enter_context(gateway_for(config, tmp, both_routes(config), fast_path=True))
        yield Wedged(gateway, members, f"http://{metrics}/metrics")


@pytest.mark.parametrize("host", [None, FAST], ids=["ext-plugin", "fast-path"])
def test_a_member_that_fails_every_request_is_not_counted_as_capacity(
    cluster: Wedged, host: str | None
) -> None:
    capacity = 'spillway_local_capacity{model="*"}'
    wedged = 'spillway_local_members{state="wedged"}'
    wait_until(lambda: cluster.metric(capacity) == 3.0, 30, "three members counted")
    traffic = Traffic(cluster.gateway.url + PATH, host)
    # Several at once: APISIX's least_conn then sends to every member (one at a time, to two).
    senders = [threading.Thread(target=traffic.run) for _ in range(CLIENTS)]
    for sender in senders:
        sender.start()
    try:
        cluster.wedge(1, True)
        wedged_at = time.monotonic()
        try:
            wait_until(lambda: cluster.metric(wedged) == 1.0, 30, "the member failing every request wedged")
        except TimeoutError as late:
            raise AssertionError(f"{late}; the gateway's view: {cluster.seen()}") from None
        assert cluster.metric(capacity) == 2.0
        found_s = time.monotonic() - wedged_at
        during = len(traffic.seen)
        cluster.wedge(1, False)
        wait_until(lambda: cluster.metric(wedged) == 0.0, 60, "the member counted again once it answers")
        assert cluster.metric(capacity) == 3.0
    finally:
        traffic.stop.set()
        for sender in senders:
            sender.join()
    failed = [(public, status) for public, status, _ in traffic.seen[:during] if status >= 500]
    name = host or "ext-plugin"
    print(f"{name}: found wedged after {found_s:.1f} s; {during} requests, {len(failed)} of them failed")
    assert all(status == 503 for _, status in failed), failed
    left = [s for s in traffic.seen if not s[0] and s[2].startswith("aws;")]
    assert not left, left
