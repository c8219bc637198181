"""The fast path's own count of the requests it has at the cluster, on a real Apache APISIX 3.18:
the plugin spills on it between scrapes, when Triton's metrics show no queue yet. A stack of its
own: the slow answers it makes would be what the runner sees local answers take in other tests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from testing.apisix import Stack, StackStarter, needs_apisix
from testing.http import wait_until
from testing.standins import StandIns
from tests.integration.test_apisix_fast_path import routes_for

pytestmark = [pytest.mark.integration, needs_apisix()]


@pytest.fixture(scope="module")
def stack(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Stack:
    config = module_stand_ins.config()
    return module_apisix_stack(config, routes_for(config), fast_path=True)


def test_requests_held_at_the_cluster_spill_the_next_before_any_scrape_shows_a_queue(stack: Stack) -> None:
    """Triton's metrics say idle all along; the plugin counts the requests it has at the cluster
    (10 ms each, one at a time: with 16 held, a 17th would take 170 ms, past 0.8 x the 200 ms
    target) and spills the next ones, and once the held ones are answered, keeps them home again."""
    stack.set_load(0)
    scraped = stack.feed.scrapes
    wait_until(lambda: stack.feed.scrapes >= scraped + 3, 10, "scrapes that give the cluster's service time")
    stack.local.delay_s = 3.0
    try:
        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(lambda _: stack.send("public"), range(24)))
    finally:
        stack.local.delay_s = 0
    assert 0 < stack.local.max_in_flight <= 16
    spilled = [stack.decision(a) for a in answers if a.get("upstream") == "aws"]
    assert spilled and all(d.startswith("aws;overflow") for d in spilled), answers
    calm = stack.send("public")
    assert calm["upstream"] == "local" and stack.decision(calm) == "local;local_ok", calm
