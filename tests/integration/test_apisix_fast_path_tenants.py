"""Clients choosing long tenant names on a real APISIX running both routes on one runner: the
decision table stays within its bound, a table the shared dict has no room for leaves the last
one in place until a smaller one fits, and the fast path never sheds public requests for either
(a module of its own: one APISIX per prefix at a time)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path import table as decision_table
from testing.apisix import Stack, StackStarter, example_plugins, needs_apisix, runner_table
from testing.http import http, wait_until
from testing.paths import TEST_LUA
from tests.integration.test_apisix_fast_path import routes_for

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
EXT_PATH = "/ext/v2/models/add_sub/infer"
FILL = {
    "id": "fill",
    "uri": "/spillway-fill",
    "plugins": {"spillway-fill": {}},
    "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1": 1}},
}


@dataclass
class Attacked:
    """The gateway, the runner's config, and what the public requests and table fetches saw."""

    front: Stack
    config: dict[str, Any]
    base: int = 0
    seen: list[tuple[int, str]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    def table_bytes(self) -> int:
        """The size of the table the runner serves now, as it encodes it."""
        return len(decision_table.encode(runner_table(self.config)))

    def public(self) -> None:
        answer = self.front.send("public")
        self.seen.append((answer["status"], self.front.decision(answer)))
        self.sizes.append(self.table_bytes())

    def attack(self, names: list[str]) -> list[int]:
        """Each name's first request (the first 1,000 on the ext-plugin route, the rest on the
        fast path) while public requests go on through the fast path."""

        def one(i: int) -> int:
            path = EXT_PATH if i < 1000 else "/v2/models/add_sub/infer"
            return int(self.front.send("public", path=path, **{"x-tenant": names[i]})["status"])

        with ThreadPoolExecutor(4) as pool:
            attacked = [pool.submit(one, i) for i in range(len(names))]
            while not all(f.done() for f in attacked):
                self.public()
        return [f.result() for f in attacked]

    def shed(self) -> list[str]:
        return [d for s, d in self.seen if s != 200 or "table_stale" in d]


def attacked_stack(start: StackStarter) -> Attacked:
    """The fast path and an ext-plugin route on one runner, a 1 MB shared dict, every tenant under
    a quota of one request a minute, and the cluster saturated: public requests overflow to aws,
    and from a stale table they would be shed."""
    config = start.stand_ins.config("SPILLWAY_SIGNING_KEY")
    config["tenants"] = {"default": {"requests_per_minute": 1}}
    ext = yaml.safe_load(
        yaml.safe_dump(route(SpillwayConfig.model_validate(config), TOKEN, "spillway-ext", "/ext/*"))
    )
    front = start(
        config,
        [*routes_for(config), ext, FILL],
        shared_dicts={"spillway": "1m"},
        more_lua_paths=[TEST_LUA],
        plugins=[*example_plugins(), "spillway", "spillway-fill"],
    )
    wait_until(lambda: front.decision(front.send("public")) == "local;local_ok", 30, "a table")
    attacked = Attacked(front, config)
    attacked.base = attacked.table_bytes()
    front.set_load(2000)
    return attacked


def held_to_quota(front: Stack, name: str) -> None:
    """Wait until the fast path sheds ``name`` for its rate quota: a table carrying its row (the
    ext-plugin route took its first request) is stored and decided from."""
    wait_until(
        lambda: front.decision(front.send("public", **{"x-tenant": name})) == "shed;tenant_rate",
        10,
        f"the fast path holding tenant {name[:8]}... to its quota from the table",
    )


def metric(front: Stack, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", front.metrics(), re.M)
    return float(found.group(1)) if found else -1.0


def test_long_tenant_names_keep_the_table_small_and_public_requests_flowing(
    apisix_stack: StackStarter,
) -> None:
    """1,000 requests on the ext-plugin route and 200 on the fast path, each with its own 7 KB
    tenant name (so each is at its limit and in the table): every table the runner serves stays
    within MAX_TENANTS rows of MAX_TENANT_ROW_BYTES, the plugin stores and uses them, and no
    public request is shed or decided from a stale table."""
    names = [f"{i:04}" + "n" * 7000 for i in range(1200)]
    attacked = attacked_stack(apisix_stack)
    statuses = attacked.attack(names)
    assert not attacked.shed(), attacked.shed()[:5]
    held_to_quota(attacked.front, names[999])
    for _ in range(200):
        attacked.public()
    log = attacked.front.gateway.error_log()
    assert statuses == [200] * 1200, "each tenant's first request went through"
    assert not attacked.shed(), attacked.shed()[:5]
    bound = attacked.base + decision_table.MAX_TENANTS * decision_table.MAX_TENANT_ROW_BYTES
    assert max(attacked.sizes) <= bound, (max(attacked.sizes), bound)
    assert "does not fit in the shared dict" not in log
    print(f"table: {attacked.base:,} bytes before, at most {max(attacked.sizes):,} (bound {bound:,})")


def test_a_table_the_full_dict_has_no_room_for_leaves_the_last_one_until_a_smaller_one_fits(
    apisix_stack: StackStarter,
) -> None:
    """The shared dict filled to the last byte (as counters clients multiply would fill it), then
    1,000 tenants at their limit: the table outgrows its 64 KiB class and cannot grow, so the
    plugin keeps the last one, says so loudly and asks the runner for one within its room, which
    leaves the least recently seen tenants out; public requests never fail safe meanwhile, and the
    most recent tenant is still held to its quota."""
    names = [f"{i:04}" + "n" * 7000 for i in range(1000)]
    attacked = attacked_stack(apisix_stack)
    front = attacked.front
    status, _, body = http("GET", front.gateway.url + "/spillway-fill")
    assert status == 200 and json.loads(body)["junk"] > 0, body
    statuses = attacked.attack(names)
    assert not attacked.shed(), attacked.shed()[:5]
    held_to_quota(front, names[-1])
    wait_until(lambda: metric(front, "spillway_fast_path_table_tenants_left_out") > 0, 10, "rows out")
    for _ in range(200):
        attacked.public()
    failures = metric(front, "spillway_fast_path_table_store_failures_total")
    left_out = metric(front, "spillway_fast_path_table_tenants_left_out")
    log = front.gateway.error_log()
    assert Counter(statuses) == {200: 1000}
    assert not attacked.shed(), attacked.shed()[:5]
    assert failures >= 1
    assert "does not fit in the shared dict spillway (no memory)" in log and "make the dict larger" in log
    print(f"full dict: {failures:.0f} tables not stored, {left_out:.0f} of 1,000 tenant rows left out")
