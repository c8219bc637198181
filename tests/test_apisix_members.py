"""A member of the on-prem cluster going away, as a pod does in a rolling update, on a real Apache
APISIX 3.18, both routes.

Before: two members, both overloaded, every public request spilled; once one member was gone (its
upstream and its metrics), a scrape round failed whole, so the survivor's overload was read no more:
the share spilled fell to 0.16-0.21 and, after ``stale_after_s``, to 0, while the survivor took the
whole load. Now the round reads the member that answers and the capacity is the survivor's: public
requests keep spilling, confidential ones stay home.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from devtools import apisix
from functions.sidecar import free_port
from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from testing.apisix import Stack, fast_path_settings, needs_apisix, stack_config
from testing.http import wait_until
from testing.standins import MetricsFeed, metrics_feed, upstream

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
FAST = "fast.test"
HOSTS = {"ext-plugin": None, "fast path": FAST}


@dataclass
class TwoMembers:
    stack: Stack
    second: MetricsFeed
    leave: ExitStack

    def spilled(self, host: str | None, count: int = 20) -> float:
        headers = {} if host is None else {"host": host}
        sent = [self.stack.send("public", **headers) for _ in range(count)]
        return sum(self.stack.decision(a).startswith("aws;") for a in sent) / count

    def all_spill(self, host: str | None) -> bool:
        return self.spilled(host, 5) == 1.0

    def members(self, state: str) -> float:
        found = re.search(rf'^spillway_local_members\{{state="{state}"\}} (\S+)$', self.stack.metrics(), re.M)
        return float(found.group(1)) if found else -1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoMembers]:
    tmp = tmp_path_factory.mktemp("apisix-members")
    with ExitStack() as stack:
        local = stack.enter_context(upstream("local"))
        aws = stack.enter_context(upstream("aws", instance="fn-1"))
        feed = stack.enter_context(metrics_feed())
        leave = stack.enter_context(ExitStack())
        second_local = leave.enter_context(upstream("local-b"))
        second = leave.enter_context(metrics_feed())
        config = stack_config(local, aws, feed)
        config["local"]["endpoints"].append({"url": second_local.url, "metrics_url": second.url})
        config["local"]["parallelism"] = 2
        validated = SpillwayConfig.model_validate(config)
        routes = [route(validated, TOKEN), {**fast_route(validated, TOKEN), "hosts": [FAST]}]
        settings = fast_path_settings(config, tmp, free_port(), routes, attr={"stale_after_s": 1.0})
        gateway = stack.enter_context(apisix.running(settings))
        made = TwoMembers(
            Stack(gateway, local, aws, feed, f"http://{config['metrics']['listen']}/metrics"), second, leave
        )
        yield made


def test_public_requests_keep_spilling_when_a_member_leaves(cluster: TwoMembers) -> None:
    cluster.stack.feed.queue_ms = cluster.second.queue_ms = 500
    for host in HOSTS.values():
        wait_until(functools.partial(cluster.all_spill, host), 30, f"{host} spilling")
    before = {name: cluster.spilled(host) for name, host in HOSTS.items()}
    assert before == {"ext-plugin": 1.0, "fast path": 1.0}, before
    assert cluster.members("up") == 2
    cluster.leave.close()
    wait_until(lambda: cluster.members("down") == 1, 30, "the member that left dropped")
    time.sleep(1.5)  # past stale_after_s (1 s): before, every request stayed home from here on
    after = {name: cluster.spilled(host) for name, host in HOSTS.items()}
    assert after == {"ext-plugin": 1.0, "fast path": 1.0}, after
    assert cluster.members("up") == 1
    for host in HOSTS.values():
        headers = {} if host is None else {"host": host}
        kept = cluster.stack.send("confidential", **headers)
        assert cluster.stack.decision(kept).startswith(("local;", "shed;")), kept
