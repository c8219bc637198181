"""The cloud leg's TLS on a real Apache APISIX 3.18: the generated config makes nginx verify a
function's certificate (chain to the trusted CAs, name of the node's host), so whoever sits on the
path to a function URL cannot answer for it. Three HTTPS function stand-ins on loopback: one with a
certificate from the trusted CA for its name, one from a CA nobody trusts, one for another name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from functions.sidecar import free_port
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import VERIFY_UPSTREAM_TLS, config_snippet
from testing.apisix import Stack, needs_apisix, stack
from testing.http import http, wait_until
from testing.standins import StandIns, metrics_feed, upstream
from testing.tls import make_ca, server_context

pytestmark = [pytest.mark.integration, needs_apisix()]

NAMES = ("good", "untrusted", "wrongname")


def tls_config(urls: dict[str, str], feed_url: str, local_url: str) -> dict[str, Any]:
    """Three targets, each chosen by a rule on ``x-which``; a breaker that opens after 3 failures."""
    return {
        "local": {"endpoints": [{"url": local_url, "metrics_url": feed_url}], "scrape_period_s": 0.1},
        "targets": [
            {"name": n, "kind": "http", "url": urls[n], "signing_key_env": None, "cold_start_ms": 0}
            for n in NAMES
        ],
        "rules": [
            {"name": n, "match": {"headers": {"x-which": n}}, "action": "target", "targets": [n]}
            for n in NAMES
        ],
        "residency": {"unclassified_may_leave": True},
        "breaker": {"consecutive_failures": 3, "cooldown_s": 600},
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
    }


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("apisix-tls")
    trusted, stranger = make_ca(tmp, "trusted-ca"), make_ca(tmp, "stranger-ca")
    contexts = {
        "good": server_context(tmp, "good", "localhost", trusted),
        "untrusted": server_context(tmp, "untrusted", "localhost", stranger),
        "wrongname": server_context(tmp, "wrongname", "other.test", trusted),
    }
    with ExitStack() as running:
        local = running.enter_context(upstream("local"))
        fns = {
            n: running.enter_context(upstream(n, instance=f"{n}-1", tls=c, host="localhost"))
            for n, c in contexts.items()
        }
        feed = running.enter_context(metrics_feed())
        config = tls_config({n: u.url for n, u in fns.items()}, feed.url, local.url)
        trio = StandIns(local, fns["good"], feed)
        yield running.enter_context(stack(trio, config, tmp, trusted_ca=str(trusted.cert)))


def _send(front: Stack, which: str) -> tuple[int, str, bytes]:
    status, headers, body = http(
        "POST",
        front.gateway.url + "/v2/models/add_sub/infer",
        b"{}",
        {"content-type": "application/json", "x-which": which},
    )
    return status, headers.get("x-spillway-decision", ""), body


def test_the_generated_config_verifies_upstream_certificates() -> None:
    snippet = config_snippet(SpillwayConfig.model_validate({"outcomes": {"listen": "127.0.0.1:9092"}}))
    assert "proxy_ssl_verify on;" in snippet["nginx_config"]["http_server_location_configuration_snippet"]
    assert snippet["apisix"]["ssl"]["ssl_trusted_certificate"] == "system"
    assert VERIFY_UPSTREAM_TLS.startswith("proxy_ssl_verify on;")


def test_a_function_with_a_trusted_certificate_for_its_name_is_served(front: Stack) -> None:
    status, decision, body = _send(front, "good")
    assert status == 200 and decision.startswith("good;") and b'"upstream": "good"' in body, (
        status,
        decision,
    )


@pytest.mark.parametrize("which", ["untrusted", "wrongname"])
def test_a_function_that_cannot_prove_who_it_is_gets_nothing_and_its_breaker_opens(
    front: Stack, which: str
) -> None:
    """A certificate from a CA nobody trusts, or for another name: nginx refuses the handshake (502
    before any byte of the request leaves), the outcome counts as the target failing, and after
    three the breaker keeps requests away from it."""
    for _ in range(3):
        status, decision, _ = _send(front, which)
        assert (status, decision.partition(";")[0]) == (502, which), (status, decision)
    opened = f'spillway_breaker_open{{target="{which}"}} 1.0'
    wait_until(lambda: opened in front.metrics(), 30, f"{which}'s breaker open")
    status, decision, body = _send(front, which)
    assert status == 200 and decision.startswith("local;") and b'"upstream": "local"' in body, decision
    assert "upstream SSL certificate verify error" in front.gateway.error_log()
