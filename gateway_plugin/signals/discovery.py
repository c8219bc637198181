"""Where the on-prem members are now: the DNS records Kubernetes publishes for a headless Service,
resolved again every period and handed to the scraper as its list of metrics URLs.

A headless Service's name resolves to the addresses of its ready pods (A/AAAA), and its named
ports to SRV records; a pod that starts, is replaced in a rolling update or is added by an
autoscaler shows there within the Service's endpoints' update. I/O at the edge: the resolver is
dnspython's, asking the configured server (or the system's) with a timeout; a failed resolution
keeps the last members, and is logged once until it succeeds again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable

import dns.asyncresolver
import dns.exception

from gateway_plugin.config.cluster import DnsDiscovery

log = logging.getLogger("spillway.discovery")

# Members kept from one resolution, at most (a name with more records is read up to this).
MAX_MEMBERS = 1000

Resolve = Callable[[], Awaitable[list[str]]]


class DiscoveryFailed(Exception):
    """The name could not be resolved (no answer in time, no such name, no records)."""


def metrics_url(host: str, port: int) -> str:
    """``http://host:port/metrics``, an IPv6 address in brackets."""
    try:
        bracketed = f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        bracketed = host
    return f"http://{bracketed}:{port}/metrics"


def resolver_for(spec: DnsDiscovery) -> dns.asyncresolver.Resolver:
    """The configured DNS server (``host:port``, ``[v6]:port``), or the system's."""
    if spec.resolver is None:
        return dns.asyncresolver.Resolver()
    resolver = dns.asyncresolver.Resolver(configure=False)
    host, _, port = spec.resolver.rpartition(":")
    resolver.nameservers = [host.strip("[]")]
    resolver.port = int(port)
    return resolver


def dns_members(spec: DnsDiscovery, resolver: dns.asyncresolver.Resolver | None = None) -> Resolve:
    """A resolution of ``spec``'s name into the members' metrics URLs, sorted."""
    asker = resolver or resolver_for(spec)

    async def addresses(name: str, record: str) -> list[str]:
        try:
            answer = await asker.resolve(name, record, lifetime=spec.timeout_s)
        except (dns.exception.DNSException, OSError) as exc:
            raise DiscoveryFailed(f"{record} {name}: {exc}") from None
        return [rr.to_text() for rr in answer][:MAX_MEMBERS]

    async def resolve() -> list[str]:
        if spec.record != "SRV":
            found = await addresses(spec.name, spec.record)
            return sorted({metrics_url(a, spec.metrics_port) for a in found})
        try:
            answer = await asker.resolve(spec.name, "SRV", lifetime=spec.timeout_s)
        except (dns.exception.DNSException, OSError) as exc:
            raise DiscoveryFailed(f"SRV {spec.name}: {exc}") from None
        urls: set[str] = set()
        for rr in list(answer)[:MAX_MEMBERS]:
            target = rr.target.to_text()
            try:
                urls.update(metrics_url(a, rr.port) for a in await addresses(target, "A"))
            except DiscoveryFailed as exc:
                log.debug("SRV target %s has no address: %s", target, exc)
        return sorted(urls)[:MAX_MEMBERS]

    return resolve


async def follow(
    resolve: Resolve, static: list[str], found: Callable[[list[str]], None], period_s: float, name: str
) -> None:
    """Resolve every ``period_s`` and hand ``found`` the static URLs plus those resolved; a failure
    keeps the last ones. Said in the log when the members change and when resolution starts or stops
    failing, not every period."""
    last: list[str] | None = None
    failing = False
    while True:
        try:
            urls = await resolve()
        except DiscoveryFailed as exc:
            if not failing:
                log.warning("on-prem members: cannot resolve %s (%s); keeping the last members", name, exc)
            failing = True
        else:
            if failing:
                log.warning("on-prem members: %s resolves again", name)
            failing = False
            if urls != last:
                log.info("on-prem members from %s: %d (%s)", name, len(urls), ", ".join(urls[:10]))
                last = urls
                found([*static, *(u for u in urls if u not in static)])
        await asyncio.sleep(period_s)
