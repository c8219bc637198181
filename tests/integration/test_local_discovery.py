"""The on-prem members discovered where Kubernetes publishes them: a headless Service's A and SRV
records, served by a real DNS server on loopback (dnsmasq) whose records change while the runner
scrapes, and each member a metrics page on its own loopback address, as each pod has its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from functions.sidecar import free_port
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.cluster import DnsDiscovery
from gateway_plugin.signals.discovery import DiscoveryFailed, dns_members, follow
from gateway_plugin.signals.load import LoadTracker
from gateway_plugin.signals.scraper import Scraper
from testing.dns import Dns, dnsmasq, needs_dnsmasq, serving_at
from testing.standins import MetricsFeed, metrics_handler

pytestmark = [pytest.mark.integration, needs_dnsmasq()]

NAME = "triton.inference.svc.cluster.local"
PODS = [f"127.0.0.{i}" for i in range(2, 6)]


@pytest.fixture
def dns(tmp_path: Path) -> Iterator[Dns]:
    with dnsmasq(tmp_path) as server:
        yield server


def test_a_and_srv_records_resolve_to_the_members_metrics_urls(dns: Dns) -> None:
    dns.set_hosts(NAME, PODS[:2])
    spec = DnsDiscovery(name=NAME, metrics_port=8002, resolver=dns.resolver)
    resolve = dns_members(spec)
    assert asyncio.run(resolve()) == ["http://127.0.0.2:8002/metrics", "http://127.0.0.3:8002/metrics"]
    dns.set_hosts(NAME, PODS[1:4])
    assert asyncio.run(resolve()) == [f"http://{a}:8002/metrics" for a in PODS[1:4]], "re-read each time"
    srv = f"_metrics._tcp.{NAME}"
    dns.set_hosts("pod-a.test", ["127.0.0.2"])
    dns.set_hosts("pod-b.test", ["127.0.0.3"])
    dns.set_srv([(srv, "pod-a.test", 9102), (srv, "pod-b.test", 9103)])
    by_srv = dns_members(DnsDiscovery(name=srv, record="SRV", resolver=dns.resolver))
    assert asyncio.run(by_srv()) == ["http://127.0.0.2:9102/metrics", "http://127.0.0.3:9103/metrics"]


def test_a_name_that_does_not_resolve_is_said_and_the_last_members_kept(
    dns: Dns, caplog: pytest.LogCaptureFixture
) -> None:
    spec = DnsDiscovery(name="nothing.test", resolver=dns.resolver, timeout_s=0.5)
    with pytest.raises(DiscoveryFailed, match=r"nothing\.test"):
        asyncio.run(dns_members(spec)())
    dns.set_hosts(NAME, PODS[:2])
    handed: list[list[str]] = []
    good = dns_members(DnsDiscovery(name=NAME, resolver=dns.resolver))
    calls = 0
    enough = asyncio.Event()

    async def flaky() -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 8:
            enough.set()
        if 2 <= calls <= 5:
            raise DiscoveryFailed("no answer")
        return await good()

    async def run() -> None:
        task = asyncio.ensure_future(follow(flaky, [], handed.append, 0.01, NAME))
        await asyncio.wait_for(enough.wait(), 30)
        task.cancel()

    asyncio.run(run())
    assert len(handed) == 1, "the same members are handed on once"
    said = [r.getMessage() for r in caplog.records if "cannot resolve" in r.getMessage()]
    assert len(said) == 1, said


def test_an_autoscaler_adding_members_doubles_the_capacity(dns: Dns) -> None:
    """Two pods, then four, then one: the runner resolves the name again each period, scrapes the
    new ones and the capacity it hands the policy follows (each pod runs ``member_parallelism`` at
    once)."""
    port = free_port()
    feeds = [MetricsFeed(compute_ms=10, pending=10) for _ in PODS]
    dns.set_hosts(NAME, PODS[:2])
    spec = DnsDiscovery(name=NAME, metrics_port=port, resolver=dns.resolver, period_s=0.1)
    tracker = LoadTracker(2.0, member_parallelism=2)
    scraper = Scraper(tracker, _fetch, [], 0.05)

    def found(urls: list[str]) -> None:
        scraper.urls = urls

    async def run(want: float) -> float:
        """Scrape rounds until the capacity is ``want`` (a loaded machine may take more periods)."""
        task = asyncio.ensure_future(follow(dns_members(spec), [], found, spec.period_s, NAME))
        deadline = time.monotonic() + 10
        try:
            while tracker.capacity != want and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                await scraper.scrape_once()
        finally:
            task.cancel()
        return tracker.capacity

    with ExitStack() as pods:
        for address, feed in zip(PODS, feeds, strict=True):
            pods.enter_context(serving_at(address, port, metrics_handler(feed, content_type=None)))
        assert asyncio.run(run(4.0)) == 4.0
        dns.set_hosts(NAME, PODS)
        assert asyncio.run(run(8.0)) == 8.0
        assert tracker.snapshot("add_sub")["add_sub"].pending == 40
        dns.set_hosts(NAME, PODS[:1])
        assert asyncio.run(run(2.0)) == 2.0


async def _fetch(url: str) -> str:
    import urllib.request

    def get() -> str:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return str(answer.read().decode())

    return await asyncio.to_thread(get)


def test_the_config_takes_a_discovery_section() -> None:
    config = SpillwayConfig.model_validate(
        {
            "local": {
                "discovery": {"dns": {"name": NAME, "record": "SRV", "resolver": "127.0.0.1:53"}},
                "member_parallelism": 2,
            }
        }
    )
    assert config.local.discovery.dns is not None and config.local.discovery.dns.record == "SRV"
    with pytest.raises(ValueError, match=r"set local\.member_parallelism"):
        SpillwayConfig.model_validate({"local": {"discovery": {"dns": {"name": NAME}}}})


def test_a_resolver_that_is_not_an_address_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"'dns\.internal:53' is not an IP address and port"):
        SpillwayConfig.model_validate(
            {
                "local": {
                    "discovery": {"dns": {"name": NAME, "resolver": "dns.internal:53"}},
                    "member_parallelism": 1,
                }
            }
        )
