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
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from testing.apisix import FAST_HOST, Stack, StackStarter, both_routes, needs_apisix
from testing.http import wait_until
from testing.standins import MetricsFeed, StandIns, metrics_feed, upstream

pytestmark = [pytest.mark.integration, needs_apisix()]

FAST = FAST_HOST
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
def cluster(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Iterator[TwoMembers]:
    with ExitStack() as leave:
        second_local = leave.enter_context(upstream("local-b"))
        second = leave.enter_context(metrics_feed())
        config = module_stand_ins.config()
        config["local"]["endpoints"].append({"url": second_local.url, "metrics_url": second.url})
        config["local"]["parallelism"] = 2
        routes = both_routes(config)
        yield TwoMembers(
            module_apisix_stack(config, routes, fast_path=True, attr={"stale_after_s": 1.0}), second, leave
        )


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
