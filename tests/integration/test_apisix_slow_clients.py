"""Clients that send a request's body a byte at a time, on a real APISIX, on both routes: while
they trickle they hold no cloud slot and no tenant's concurrency slot, so the requests of others
still spill and the tenant still gets through (a module of its own: one APISIX per prefix at a
time)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest

from testing.apisix import Stack, StackStarter, needs_apisix
from testing.http import wait_until
from tests.integration.test_apisix_fast_path import routes_for

pytestmark = [pytest.mark.integration, needs_apisix()]

DECLARED = 100_000  # the body each slow client declares, of which it sends a byte a second
PUBLIC = {"x-data-classification": "public"}
T1 = {"x-data-classification": "secret", "x-tenant": "t1"}


@contextmanager
def trickling(url: str, clients: list[dict[str, str]]) -> Iterator[threading.Event]:
    """One connection per entry of ``clients`` (its headers): a request head declaring a
    ``DECLARED``-byte body, then one byte of it a second until the block ends, when every socket
    is closed. Yields an event set at each byte round, for the caller to wait on."""
    where = urlsplit(url)
    sockets = [socket.create_connection((where.hostname, where.port), timeout=5) for _ in clients]
    stop, ticked = threading.Event(), threading.Event()

    def drip() -> None:
        while True:
            for sock in sockets:
                sock.sendall(b" ")
            ticked.set()
            if stop.wait(1.0):
                return

    try:
        for sock, headers in zip(sockets, clients, strict=True):
            lines = [
                "POST /v2/models/add_sub/infer HTTP/1.1",
                f"Host: {where.hostname}",
                "Content-Type: application/json",
                f"Content-Length: {DECLARED}",
                *(f"{name}: {value}" for name, value in headers.items()),
            ]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        dripping = threading.Thread(target=drip, daemon=True)
        dripping.start()
        try:
            yield ticked
        finally:
            stop.set()
            dripping.join(timeout=5)
    finally:
        for sock in sockets:
            sock.close()


def _stack(start: StackStarter, route: str) -> Stack:
    config = start.stand_ins.config()
    config["targets"][0]["concurrency_cap"] = 3
    config["tenants"] = {"quotas": {"t1": {"concurrency": 1}}}
    fast_path = route == "fast_path"
    front = start(config, routes_for(config) if fast_path else None, fast_path=fast_path, workers=2)
    wait_until(lambda: front.decision(front.send("public")) == "local;local_ok", 30, "a decision")
    # Overflowing, as a request that may not leave says (kept home for residency), with no answer
    # from aws yet: the runner then counts a request sent there until its timeout.
    front.feed.queue_ms = 500
    wait_until(lambda: front.decision(front.send("secret")).startswith("local;residency"), 30, "overflow")
    return front


@pytest.mark.parametrize("route", ["fast_path", "ext_plugin"])
def test_clients_trickling_their_bodies_hold_no_cloud_slot_and_no_tenant_slot(
    apisix_stack: StackStarter, route: str
) -> None:
    """aws may have 3 requests in flight and tenant t1 one. Three clients declare a 100,000-byte
    public body and a fourth one of t1's, then send a byte a second: meanwhile three public
    requests of others still spill to aws, and t1's request is served rather than shed. (Three
    and one: on the ext-plugin route the runner counts a request until the logger reports its
    answer, up to a second later.)"""
    front = _stack(apisix_stack, route)
    with trickling(front.gateway.url, [PUBLIC, PUBLIC, PUBLIC, T1]) as ticked:
        for _ in range(3):  # two seconds of trickling before the first look
            ticked.clear()
            assert ticked.wait(5), "the slow clients stopped sending"
        spilled = [front.decision(front.send("public")) for _ in range(3)]
        tenant = front.send("secret", **{"x-tenant": "t1"})
    assert all(d.startswith("aws;") for d in spilled), spilled
    assert tenant["status"] == 200, front.decision(tenant)
