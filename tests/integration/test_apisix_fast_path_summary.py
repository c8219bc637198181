"""The fast path's summaries of outcomes on a real APISIX: what a target answered reaches its
breaker however many tenant names clients make up (a module of its own: one APISIX per prefix at
a time)."""

from __future__ import annotations

import http.client
import json
import re
import selectors
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from testing.apisix import Stack, needs_apisix, stack
from testing.http import wait_until
from testing.standins import stand_ins
from tests.integration.test_apisix_fast_path import routes_for

pytestmark = [pytest.mark.integration, needs_apisix()]

FLOOD = 10_000
OPEN = 'spillway_breaker_open{target="aws"} 1.0'


def _client(url: str, names: range) -> list[tuple[int, str]]:
    """One keep-alive connection's requests kept home (``secret``), one per tenant name
    ``flood-<i>``; their statuses and decisions."""
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    headers = {"content-type": "application/json", "x-data-classification": "secret"}
    seen = []
    try:
        for i in names:
            connection.request(
                "POST", "/v2/models/add_sub/infer", b"{}", {**headers, "x-tenant": f"flood-{i}"}
            )
            answer = connection.getresponse()
            answer.read()
            seen.append((answer.status, answer.getheader("x-spillway-decision", "")))
    finally:
        connection.close()
    return seen


def flood(url: str, names: range, clients: int = 8) -> Counter[tuple[int, str]]:
    """``names`` spread over ``clients`` connections; how many got each status and decision."""
    with ThreadPoolExecutor(clients) as pool:
        parts = pool.map(_client, [url] * clients, [names[k::clients] for k in range(clients)])
        return Counter(seen for part in parts for seen in part)


def decisions(front: Stack) -> float:
    """Every decision the runner has counted from the plugin's summaries."""
    found = re.findall(r"^spillway_decisions_total\{[^}]*\} ([0-9.e+]+)$", front.metrics(), re.MULTILINE)
    return sum(float(n) for n in found)


def test_a_flood_of_tenant_names_cannot_keep_a_failing_targets_breaker_closed(tmp_path: Path) -> None:
    """Every tenant counted (a default quota), aws answering 500, one worker sending its summary
    every 10 s: 10,000 requests with distinct tenant names, then five that go to aws in the same
    summary as at least 600 of them. The tenants' entries fill their bound, and aws's failures
    still open its breaker (they used to share one 1,000-key bound, which the flood had filled)."""
    with ExitStack() as running:
        trio = running.enter_context(stand_ins(nodelay=True))
        config = trio.config()
        config["tenants"] = {"default": {"requests_per_minute": 1_000_000}}
        # What the flood sends local must not read as a saturated cluster, which would shed it: the
        # feed says 500 ms queued, and the flood sends hundreds between two scrapes.
        config["overflow"] = {"saturation_ratio": 10_000}
        config["local"]["max_queue_ms"] = 3_600_000
        routes = routes_for(config)
        front = running.enter_context(
            stack(trio, config, tmp_path, routes, fast_path=True, workers=1, attr={"batch_s": 10})
        )
        feed, aws, gateway = trio.feed, trio.aws, front.gateway
        sent = 0

        def decided(classification: str) -> str:
            nonlocal sent
            sent += 1
            return front.decision(front.send(classification))

        wait_until(lambda: decided("public") == "local;local_ok", 30, "a table")
        # 6,000 pending: the backlog, which drains with the scrape's age at the cluster's speed
        # (100 a second here), still overflows after a minute without a scrape (a busy host
        # delays them; 50 pending drained in half a second).
        feed.queue_ms, feed.pending, aws.status = 500, 6_000, 500
        # Overflowing, as a request that may not leave says, and nothing sent to aws yet.
        wait_until(lambda: decided("secret").startswith("local;residency"), 30, "overflow")
        # Just after a summary went out, so that the flood has most of a summary to itself.
        reported = decisions(front)
        wait_until(lambda: decisions(front) > reported, 30, "a summary of the requests so far")
        names = FLOOD
        assert flood(gateway.url, range(names)) == {(200, "local;residency"): names}
        sent += names
        # A summary may have gone out at the end of the flood: then 600 more names, until the
        # summary aws's answers join holds at least 600 of them (a flood of its own).
        for _ in range(10):
            if sent - decisions(front) >= 600:
                break
            assert flood(gateway.url, range(names, names + 600)).total() == 600
            names, sent = names + 600, sent + 600
        failed = [front.send("public") for _ in range(5)]
        assert [(a["status"], front.decision(a)[:4]) for a in failed] == [(500, "aws;")] * 5
        wait_until(lambda: OPEN in front.metrics(), 30, "aws's failures reported: its breaker open")
        # The plugin sees it with its next table (fetched every 50 ms).
        wait_until(lambda: front.decision(front.send("public")) == "local;no_target", 10, "aws skipped")


class SummaryTap:
    """A loopback relay between the plugin and the runner that keeps the summaries the plugin
    posts (parsed as the runner gets them), so a test reads what went over the wire."""

    def __init__(self, runner: str) -> None:
        host, _, port = runner.rpartition(":")
        self.runner = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.summaries: list[dict[str, Any]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                plugin, _ = self.listener.accept()
            except OSError:
                return
            try:
                runner = socket.create_connection(self.runner, timeout=30)
            except OSError:  # the runner is not up yet: the plugin tries again
                plugin.close()
                continue
            threading.Thread(target=self._relay, args=(plugin, runner), daemon=True).start()

    def _relay(self, plugin: socket.socket, runner: socket.socket) -> None:
        """Both directions of one connection, until either side closes it."""
        requests = bytearray()
        with plugin, runner, selectors.DefaultSelector() as selector:
            selector.register(plugin, selectors.EVENT_READ)
            selector.register(runner, selectors.EVENT_READ)
            try:
                while True:
                    for key, _ in selector.select():
                        source = plugin if key.fileobj is plugin else runner
                        if not (chunk := source.recv(65536)):
                            return
                        (runner if source is plugin else plugin).sendall(chunk)
                        if source is plugin:
                            requests += chunk
                            self._take(requests)
            except OSError:
                return

    def _take(self, requests: bytearray) -> None:
        while (end := requests.find(b"\r\n\r\n")) >= 0:
            head = bytes(requests[:end]).decode("latin-1")
            framed = re.search(r"(?im)^content-length:\s*(\d+)", head)
            length = int(framed.group(1)) if framed else 0
            if len(requests) < end + 4 + length:
                return
            body = bytes(requests[end + 4 : end + 4 + length])
            del requests[: end + 4 + length]
            if head.startswith("POST /spillway/fast-outcomes "):
                self.summaries.append(json.loads(body))

    def close(self) -> None:
        self.listener.close()


def test_a_summary_says_over_how_long_it_sent_local(tmp_path: Path) -> None:
    """The runner adds to the cluster's backlog only the share of a summary's local requests sent
    since its last scrape, so the plugin says when the first of them went: two requests a second
    apart, in one summary (every 3 s), span at least that second and at most the test's own
    measure from the first to the summary's arrival."""
    with ExitStack() as running:
        trio = running.enter_context(stand_ins(nodelay=True))
        config = trio.config()
        tap = SummaryTap(config["outcomes"]["listen"])
        running.callback(tap.close)
        attr = {"batch_s": 3, "runner": tap.address}
        front = running.enter_context(
            stack(trio, config, tmp_path, routes_for(config), fast_path=True, workers=1, attr=attr)
        )
        wait_until(lambda: front.decision(front.send("public")) == "local;local_ok", 30, "a table")
        seen = len(tap.summaries)
        time.sleep(0.5)  # the last request's log phase, after its answer, has counted it
        wait_until(lambda: len(tap.summaries) > seen, 30, "a summary of the requests so far")
        # Half a second into the next summary's 3 s: a span counted from the last summary instead
        # of the first request would exceed the test's measure by that much.
        time.sleep(0.5)
        started = time.monotonic()
        assert front.decision(front.send("public")) == "local;local_ok"
        time.sleep(1.0)
        assert front.decision(front.send("public")) == "local;local_ok"
        seen = len(tap.summaries)
        wait_until(lambda: len(tap.summaries) > seen, 30, "the summary of the two")
        elapsed = time.monotonic() - started
        summary = tap.summaries[seen]
        assert summary["sent_local"] == {"add_sub": 2}, summary
        # nginx's clock is the wall clock at millisecond resolution, which NTP may slew against
        # the test's monotonic one: 50 ms of slack above (a millisecond below).
        assert 0.999 <= float(summary["span_s"]) <= elapsed + 0.05, (summary, elapsed)
