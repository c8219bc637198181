"""The fast path's shared-dict counters (``spillway/counters.lua``) on a real APISIX, run by a
test-only plugin on a small dict filled to the last byte: nothing is evicted to make room, a
missing node id is made anew, spend below its mark never reads negative, and an idle tenant's
in-flight count expires instead of being deleted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import apisix
from functions.sidecar import free_port
from gateway_plugin.apisix_fast_route import lua_path
from tests.apisix_support import needs_apisix
from tests.support import ROOT, http

pytestmark = [pytest.mark.integration, needs_apisix()]


@pytest.fixture(scope="module")
def seen() -> Iterator[dict[str, Any]]:
    route = {
        "id": "counters",
        "uri": "/spillway-counters",
        "plugins": {"spillway-counters": {}},
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1": 1}},
    }
    settings = apisix.ApisixSettings(
        port=free_port(),
        routes_yaml=json.dumps({"routes": [route]}),
        plugins=["spillway-counters"],
        extra_lua_path=lua_path(),
        more_lua_paths=[ROOT / "tests" / "lua"],
        shared_dicts={"spillway-full": "64k"},
    )
    with apisix.running(settings) as running:
        status, _, body = http("GET", running.url + "/spillway-counters")
        assert status == 200, body[:500]
        yield json.loads(body)


def test_a_full_dict_refuses_a_new_counter_and_evicts_nothing(seen: dict[str, Any]) -> None:
    assert seen["junk"] > 0
    assert seen["add_when_full"] == {"err": "no memory"}
    assert seen["tenant_when_full"] == {"err": "no memory"}
    assert seen["node_kept"] == "n-1" and seen["spend_kept"] == 5
    assert seen["spend_grows"] == 6.5


def test_a_missing_node_id_is_made_anew_and_spend_below_its_mark_is_all_new(seen: dict[str, Any]) -> None:
    assert isinstance(seen["node_made_anew"], str) and seen["node_made_anew"] != "n-1"
    assert seen["since_mark"] == [1.5, 0.25]


def test_a_tenants_count_expires_once_idle_instead_of_being_deleted(seen: dict[str, Any]) -> None:
    assert seen["tenant_taken"] == [1, 2]
    assert 0 < seen["busy_ttl"] <= 600
    one_left, ttl = seen["one_left"]
    assert one_left == 1 and ttl > 10, "a tenant with a request in flight keeps its count"
    idle, idle_ttl = seen["idle"]
    assert idle == 0 and 0 < idle_ttl <= 10


def test_a_long_tenant_name_is_keyed_by_its_hash(seen: dict[str, Any]) -> None:
    assert seen["short_tenant"] == "t1"
    assert seen["long_tenant"].startswith("sha256:") and len(seen["long_tenant"]) == 7 + 64
