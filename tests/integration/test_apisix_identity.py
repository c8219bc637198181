"""Who the tenant is, on a real Apache APISIX 3.18 with key-auth, on both paths: with
``tenants.source: consumer`` the tenant is the consumer APISIX authenticated, never the ``X-Tenant``
a client sends, and a consumer whose data may not leave keeps its requests home.

The ext-plugin route raises key-auth's priority above the edge's (the runner decides in the
rewrite phase); the fast path's plugin decides in the access phase, after authentication.
"""

from __future__ import annotations

import functools
import os
import re
import time
from typing import Any

import pytest
import yaml

from gateway_plugin.apisix_route import RouteError, route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from testing.apisix import FAST_HOST, Stack, StackStarter, both_routes, example_plugins, needs_apisix
from testing.http import http, wait_until
from testing.standins import StandIns

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
FAST = FAST_HOST
KEYS = {"alice": "alice-key-0123456789", "bob": "bob-key-0123456789", "carol": "carol-key-0123456789"}
CONSUMERS = [{"username": name, "plugins": {"key-auth": {"key": key}}} for name, key in KEYS.items()]


def identity_config(config: dict[str, Any]) -> dict[str, Any]:
    config["tenants"] = {"source": "consumer", "quotas": {"alice": {"requests_per_minute": 3}}}
    config["residency"] = {"consumer_ceilings": {"carol": "confidential"}}
    return config


class Front(Stack):
    def ask(self, host: str | None, consumer: str | None, **headers: str) -> tuple[int, str, dict[str, Any]]:
        """Status, decision and what the upstream saw, for a request as ``consumer`` (None: no key)."""
        sent = {"content-type": "application/json", "x-data-classification": "public", **headers}
        if consumer is not None:
            sent["apikey"] = KEYS[consumer]
        if host is not None:
            sent["host"] = host
        status, answer, body = http("POST", self.gateway.url + "/v2/models/add_sub/infer", b"{}", sent)
        seen = yaml.safe_load(body) if body.startswith(b"{") else {}
        return status, answer.get("x-spillway-decision", ""), seen

    def spills(self, host: str | None) -> bool:
        return self.ask(host, "bob")[1].startswith("aws;")

    def decisions(self) -> float:
        return sum(
            float(v) for v in re.findall(r"^spillway_decisions_total\{[^}]*\} (\S+)$", self.metrics(), re.M)
        )

    def settled_decisions(self) -> float:
        """The count once the fast path's summaries of earlier requests are in (each worker posts
        them every 0.2 s): unchanged for a second."""
        last, since = self.decisions(), time.monotonic()
        deadline = since + 15
        while time.monotonic() - since < 1.0:
            assert time.monotonic() < deadline, "the decision count never settled"
            time.sleep(0.1)
            now = self.decisions()
            if now != last:
                last, since = now, time.monotonic()
        return last


@pytest.fixture(scope="module")
def front(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Front:
    config = identity_config(module_stand_ins.config())
    routes = both_routes(config, auth="key-auth")
    started = module_apisix_stack(
        config,
        routes,
        plugins=[*example_plugins(), "spillway", "key-auth"],
        routes_yaml=yaml.safe_dump({"routes": routes, "consumers": CONSUMERS}, sort_keys=False),
    )
    made = Front.of(started)
    made.feed.queue_ms = 500
    for host in (None, FAST):
        wait_until(functools.partial(made.spills, host), 30, f"{host} spilling")
    return made


def test_without_an_authentication_plugin_the_route_is_refused_rather_than_trusting_the_header() -> None:
    config = SpillwayConfig.model_validate(
        {
            "tenants": {"source": "consumer"},
            "local": {"endpoints": [{"url": "http://127.0.0.1:1", "metrics_url": "http://127.0.0.1:1/m"}]},
        }
    )
    with pytest.raises(RouteError, match="--auth"):
        route(config, TOKEN)
    with pytest.raises(RouteError, match="--auth"):
        fast_route(config, TOKEN)


@pytest.mark.parametrize("host", [None, FAST], ids=["ext-plugin", "fast-path"])
def test_a_client_claiming_another_tenant_is_counted_and_limited_as_its_own_consumer(
    front: Front, host: str | None
) -> None:
    """alice's quota is 3 requests a minute; she says she is bob. Before (tenants from the header):
    her requests counted against bob. Now they are alice's: she is limited, bob is not, and the
    header she sent does not reach the upstream."""
    statuses = []
    for _ in range(12):
        status, decision, seen = front.ask(host, "alice", **{"x-tenant": "bob"})
        statuses.append(status)
        if status == 200:
            assert "x-tenant" not in seen["headers"], seen
        if status == 429:
            assert "tenant_rate" in decision, decision
            break
    assert statuses[-1] == 429, f"alice was never limited: {statuses}"
    for _ in range(5):
        status, _, _ = front.ask(host, "bob", **{"x-tenant": "alice"})
        assert status == 200, "bob is not alice, whatever he says"


@pytest.mark.parametrize("host", [None, FAST], ids=["ext-plugin", "fast-path"])
def test_an_unauthenticated_request_gets_no_decision_and_spends_nothing(
    front: Front, host: str | None
) -> None:
    before = front.settled_decisions()
    for claimed in ("bob", "alice", ""):
        status, decision, _ = front.ask(host, None, **{"x-tenant": claimed})
        assert status == 401 and decision == "", (status, decision)
    assert front.settled_decisions() == before


@pytest.mark.parametrize("host", [None, FAST], ids=["ext-plugin", "fast-path"])
def test_a_consumer_whose_data_may_not_leave_stays_home_whatever_its_label(
    front: Front, host: str | None
) -> None:
    status, decision, seen = front.ask(host, "carol")
    assert (status, decision, seen["upstream"]) == (200, "local;residency", "local")
    status, decision, seen = front.ask(host, "bob")
    assert status == 200 and decision.startswith("aws;") and seen["upstream"] == "aws"
