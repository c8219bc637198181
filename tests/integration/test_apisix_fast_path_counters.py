"""The fast path's shared-dict counters (``spillway/counters.lua``) and the decision table's store
(``spillway/table.lua``) on a real APISIX, run by a test-only plugin on small dicts filled to the
last byte: nothing is evicted to make room, a missing node id is made anew, spend below its mark
never reads negative, an idle tenant's in-flight count expires instead of being deleted, a table
that cannot grow leaves the last one stored, and tenant names are keyed as the runner keys them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway_plugin.policy.tenants import tenant_key
from testing.apisix import lua_plugin_gateway, needs_apisix
from testing.http import http

pytestmark = [pytest.mark.integration, needs_apisix()]


@pytest.fixture(scope="module")
def seen() -> Iterator[dict[str, Any]]:
    dicts = {"spillway-full": "64k", "spillway-store": "512k"}
    with lua_plugin_gateway("spillway-counters", "counters", shared_dicts=dicts) as running:
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


def test_spend_a_rounding_below_its_mark_is_the_same_counter(seen: dict[str, Any]) -> None:
    """The report carries the spend counter with cjson's 14 digits and the table brings it back
    as the mark: a counter of cents sits a rounding below it, which is nothing spent since, not
    a counter made anew whose every cent is new (that blocked the plugin's budget for good)."""
    assert abs(seen["since_rounded_mark"]) < 1e-9, seen["since_rounded_mark"]


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


# The same vectors as tests/lua/apisix/plugins/spillway-counters.lua TENANT_VECTORS, as bytes.
TENANT_VECTORS = (
    b"t1",
    b"acme corp",
    b"t" * 256,
    b"t" * 257,
    b"t" * 5000,
    "caf\u00e9".encode(),
    b"a\xffb",
    b"tab\there",
    b"",
)
# Known answers: SHA-256 of each name that is keyed by its hash, computed outside both sides.
KNOWN = {
    3: "e3df393973f5098c4b2c29cd51154cd107ea31a000214e1ec42dc9b2bfd1b3b3",
    4: "b55c73dd017f6fafb5939b7073e73660000de3cb445eff2e54ed2d65db1c18de",
    5: "850f7dc43910ff890f8879c0ed26fe697c93a067ad93a7d50f466a7028a9bf4e",
    6: "01ce0241d2a0e71a4fecd5a8d71157fe2787197732fc15d889cbcf36c38e3c68",
    7: "5b8765931ded06ac39c11c47f83f7457636af4780d72900c1a0131f4ccb96c85",
}


def python_keys() -> list[str]:
    return [tenant_key(name.decode("utf-8", "surrogateescape")) for name in TENANT_VECTORS]


def test_tenant_keys_are_the_known_answers_in_python() -> None:
    keys = python_keys()
    assert keys[:3] == ["t1", "acme corp", "t" * 256] and keys[8] == ""
    assert {i: keys[i] for i in KNOWN} == {i: "sha256:" + digest for i, digest in KNOWN.items()}


def test_the_plugin_keys_tenant_names_exactly_as_the_runner_does(seen: dict[str, Any]) -> None:
    """Past 256 bytes, and with any byte outside printable ASCII (UTF-8 or not), by the hash of
    the bytes: a tenant's books are one whichever route it came through."""
    assert seen["tenant_keys"] == python_keys()


def test_a_table_that_cannot_grow_leaves_the_last_one_stored_and_evicts_nothing(
    seen: dict[str, Any],
) -> None:
    store = seen["store"]
    assert store["plain_grow"][:2] == [False, "no memory"] and not store["plain_left"], (
        "one key: a larger value that finds no room takes the old one with it"
    )
    assert store["first"][0] is True
    assert store["in_place"][0] is True and store["after_in_place"] == 2, "in place in a full dict"
    assert store["grow"] == [False, "no memory", 65536], "no room to grow: the room is its class"
    assert store["after_grow"] == 2 and store["nothing_evicted"]
    assert store["grown"][0] is True and store["after_grown"] == 4
    assert store["class"] == 131072 and store["old_class_freed"]
