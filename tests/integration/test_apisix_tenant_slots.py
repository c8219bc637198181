"""A tenant's concurrency quota on a real Apache APISIX 3.18 releases what it counts, on both routes,
for each ``tenants.source``, whether the request stays home or spills.

Before, on the ext-plugin route the outcome's tenant was read from the tenant header as it reached
the upstream: a header the runner removes in consumer mode and that a cloud target never receives,
so a slot taken by the decision was never given back by the answer (only the 60 s in-flight TTL
freed it): one consumer with concurrency 1 got one request a minute. The outcome now carries the
tenant the decision counted, from the edge's variable, as the target and the deciding worker are.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from testing.apisix import FAST_HOST, Stack, both_routes, example_plugins, needs_apisix, stack
from testing.http import http, wait_until
from testing.standins import stand_ins

pytestmark = [pytest.mark.integration, needs_apisix()]

FAST = FAST_HOST
KEY = "alice-key-0123456789"
CONSUMERS = [{"username": "alice", "plugins": {"key-auth": {"key": KEY}}}]
# The route's logger posts an outcome at most ``outcomes.batch_s`` (1 s) after the answer; a request
# is finished for the books once its outcome is in.
REPORTED_S = 2.0
HOSTS = [None, FAST]
HOST_IDS = ["ext-plugin", "fast-path"]
LOADS = {"local": 0.0, "cloud": 500.0}


class Front(Stack):
    source: str = "header"

    def ask(self, host: str | None) -> tuple[int, str]:
        """Status and decision of one public request of tenant alice."""
        sent = {"content-type": "application/json", "x-data-classification": "public"}
        if self.source == "consumer":
            sent["apikey"] = KEY
        else:
            sent["x-tenant"] = "alice"
        if host is not None:
            sent["host"] = host
        status, answer, _ = http("POST", self.gateway.url + "/v2/models/add_sub/infer", b"{}", sent)
        return status, answer.get("x-spillway-decision", "")

    def load(self, queue_ms: float, host: str | None) -> None:
        """Triton's queue as the runner scrapes it, until alice's requests show it on ``host``'s route."""
        self.feed.queue_ms = queue_ms
        want = "aws;" if queue_ms > 200 else "local;"

        def shown() -> bool:
            time.sleep(REPORTED_S)  # the previous try's slot back first
            return self.ask(host)[1].startswith(want)

        wait_until(shown, 60, f"decisions {want}")

        def served_in_turn() -> bool:
            time.sleep(REPORTED_S)
            return self.ask(host)[0] == 200

        # Once more, until a request served after the previous one's report was due is served:
        # the first report of a fresh stack (its logger's first batch) may come later than that.
        wait_until(served_in_turn, 30, "alice served after her previous request reported")
        time.sleep(REPORTED_S)


@pytest.fixture(scope="module", params=["header", "consumer"])
def front(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    source: str = request.param
    tmp = tmp_path_factory.mktemp(f"apisix-tenant-slots-{source}")
    with stand_ins() as trio:
        config = trio.config()
        config["tenants"] = {"source": source, "quotas": {"alice": {"concurrency": 1}}}
        routes = both_routes(config, auth="key-auth" if source == "consumer" else None)
        made: dict[str, Any] = {"routes": routes}
        if source == "consumer":
            made["consumers"] = CONSUMERS
        plugins = [*example_plugins(), "spillway", "key-auth"]
        routes_yaml = yaml.safe_dump(made, sort_keys=False)
        with stack(trio, config, tmp, routes, plugins=plugins, routes_yaml=routes_yaml) as made:
            front = Front.of(made)
            front.source = source
            yield front


@pytest.mark.parametrize("load", list(LOADS))
@pytest.mark.parametrize("host", HOSTS, ids=HOST_IDS)
def test_a_concurrency_of_one_serves_requests_in_turn_and_limits_those_in_parallel(
    front: Front, host: str | None, load: str
) -> None:
    """Three requests one after another (each answered and reported before the next) are all
    served; four at once are limited to one. The upstream takes half a second throughout: on the
    ext-plugin route a dispatch counts for about as long as answers have lately taken (their
    reports arrive up to a second late, books.ledger.Outstanding), so the first three teach it
    that."""
    front.load(LOADS[load], host)
    front.local.delay_s = front.aws.delay_s = 0.5
    try:
        in_turn = []
        for _ in range(3):
            in_turn.append(front.ask(host))
            time.sleep(REPORTED_S)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            at_once = list(pool.map(lambda _: front.ask(host), range(4)))
    finally:
        front.local.delay_s = front.aws.delay_s = 0.0
    assert [status for status, _ in in_turn] == [200] * 3, in_turn
    target = "aws;" if load == "cloud" else "local;"
    assert all(decision.startswith(target) for _, decision in in_turn), in_turn
    assert sorted(status for status, _ in at_once) == [200, 429, 429, 429], at_once
    assert all("tenant_concurrency" in decision for status, decision in at_once if status == 429), at_once
    time.sleep(REPORTED_S)
    assert front.ask(host)[0] == 200, "the slot came back once the one in flight answered"
