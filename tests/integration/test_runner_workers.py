"""``runner.workers: 2``: one parent on APISIX's socket, two worker processes, one real redis-server.

The runner runs as APISIX starts it (``python -m gateway_plugin run``); the test talks APISIX's side
of the protocol to the one socket (``devtools.apisix_peer``), whose connections the kernel hands to
either worker, and posts outcomes to the parent's endpoint as the route's http-logger does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.apisix_peer import ApisixPeer, PeerRequest, RouteConf
from functions.sidecar import free_port
from gateway_plugin.books.outcomes import auth_header
from gateway_plugin.books.target_header import target_value
from gateway_plugin.config import ConfigError, parse
from gateway_plugin.worker_group import OutcomeFanOut
from testing.budget import clear_of_the_hours_end
from testing.http import http, wait_until
from testing.paths import ROOT
from testing.redis import needs_redis, redis_server

ROUTE = RouteConf("route#spillway", [("spillway", "{}")])
TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
AWS = target_value("aws", TOKEN)


def test_more_than_one_worker_needs_shared_state() -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"runner": {"workers": 2}})
    assert "runner.workers is 2" in str(caught.value) and "shared_state" in str(caught.value)
    assert (
        parse({"runner": {"workers": 2}, "shared_state": {"redis_url": "redis://r:6379/0"}}).runner.workers
        == 2
    )


class Workers:
    def __init__(
        self, tmp: Path, proc: subprocess.Popen[bytes], sock: Path, metrics: int, outcomes: int
    ) -> None:
        self.tmp, self.proc, self.sock, self.metrics, self.outcomes = tmp, proc, sock, metrics, outcomes

    def metric(self, worker: int, name: str, **labels: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        _, _, body = http("GET", f"http://127.0.0.1:{self.metrics + worker}/metrics")
        total = 0.0
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def serving(self) -> bool:
        try:
            return all(self.metric(w, "spillway_shared_state_connected") == 1 for w in (0, 1))
        except OSError:
            return False

    def report(self, entries: list[dict[str, str]]) -> None:
        headers = {"authorization": auth_header(TOKEN), "content-type": "application/json"}
        url = f"http://127.0.0.1:{self.outcomes}/spillway/outcomes"
        status, _, body = http("POST", url, json.dumps(entries).encode(), headers)
        assert status == 204, body

    def log(self) -> str:
        return (self.tmp / "runner.log").read_text()


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` loopback ports free together (worker i serves metrics on port + i)."""
    for _ in range(100):
        first = free_port()
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free loopback ports")


@contextmanager
def two_workers(tmp: Path, **extra: Any) -> Iterator[Workers]:
    with redis_server(tmp / "redis") as server:
        metrics = consecutive_free_ports(2)
        outcomes = free_port()
        while outcomes in (metrics, metrics + 1):
            outcomes = free_port()
        cfg: dict[str, Any] = {
            "runner": {"workers": 2},
            "targets": [
                {
                    "name": "aws",
                    "kind": "aws_lambda",
                    "url": "https://aws.example/",
                    "timeout_s": 300,
                    "concurrency_cap": 1000,
                    "cost": {"usd_per_request": 0.01, "usd_per_gb_second": 0, "billed_init": False},
                }
            ],
            "rules": [{"name": "out", "action": "target", "targets": ["aws"]}],
            "breaker": {"consecutive_failures": 2, "cooldown_s": 60},
            "metrics": {"listen": f"127.0.0.1:{metrics}"},
            "outcomes": {"listen": f"127.0.0.1:{outcomes}"},
            "shared_state": {
                "redis_url": server.url,
                "nodes_expected": 1,
                "sync_period_ms": 50,
                "lease_share": 0.1,
            },
            **extra,
        }
        (tmp / "spillway.yaml").write_text(yaml.safe_dump(cfg))
        sock = tmp / "runner.sock"
        with (tmp / "runner.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway_plugin", "run", "--config", str(tmp / "spillway.yaml")],
                cwd=ROOT,
                env={**os.environ, "APISIX_LISTEN_ADDRESS": f"unix:{sock}"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            workers = Workers(tmp, proc, sock, metrics, outcomes)
            try:
                wait_until(lambda: workers.serving() or proc.poll() is not None, 60, "two workers")
                assert proc.poll() is None, workers.log()
                yield workers
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)


async def wave(sock: Path, count: int, classification: str = "public") -> Counter[tuple[str, str]]:
    """``count`` concurrent requests over 16 connections: (target, worker) of each decision."""
    peer = ApisixPeer(sock, pool_size=16, timeout_s=10)
    request = PeerRequest("POST", "/v2/models/m/infer", headers=[("x-data-classification", classification)])
    try:
        outcomes = await asyncio.gather(*(peer.request(ROUTE, request) for _ in range(count)))
    finally:
        await peer.close()
    seen: Counter[tuple[str, str]] = Counter()
    for outcome in outcomes:
        assert outcome.rewrite is not None, outcome
        headers = dict(outcome.rewrite.headers)
        target = "aws" if headers["x-spillway-target"] == AWS else headers["x-spillway-target"]
        seen[(target, headers["x-spillway-worker"])] += 1
    return seen


def fill_to_the_cap(workers: Workers, cap: int) -> Counter[tuple[str, str]]:
    """Waves of requests that are never answered until ``cap`` of them went to the cloud: slots
    move between the workers in rounds with the store, so how many waves that takes depends on
    how the rounds fall; the cap must hold at every wave and a few after."""
    seen: Counter[tuple[str, str]] = Counter()

    def spilled() -> int:
        return sum(n for (t, _), n in seen.items() if t == "aws")

    deadline = time.monotonic() + 30
    while spilled() < cap and time.monotonic() < deadline:
        seen += asyncio.run(wave(workers.sock, 40))
        assert spilled() <= cap, f"the cap holds across workers: {seen}"
    assert spilled() == cap, f"{cap} slots filled within 30 s: {seen}"
    for _ in range(3):
        seen += asyncio.run(wave(workers.sock, 40))
    assert spilled() == cap, f"the cap holds across workers: {seen}"
    return seen


@needs_redis
@pytest.mark.integration
def test_two_workers_under_load_keep_the_budget_and_residency(tmp_path: Path) -> None:
    clear_of_the_hours_end()
    with two_workers(tmp_path, budgets={"per_target_hourly_usd": {"aws": 1.0}}) as workers:
        seen: Counter[tuple[str, str]] = Counter()
        for _ in range(15):
            got = asyncio.run(wave(workers.sock, 100)) + asyncio.run(wave(workers.sock, 30, "confidential"))
            seen += got
            assert not any(
                t == "aws" for (t, _), n in asyncio.run(wave(workers.sock, 10, "pii")).items() if n
            )
        cloud = sum(n for (t, _), n in seen.items() if t == "aws")
        workers_seen = {w for (_, w) in seen}
        spent = sum(workers.metric(w, "spillway_cloud_spend_usd_total", target="aws") for w in (0, 1))
    assert workers_seen == {"0", "1"}, "the kernel handed connections to both workers"
    assert 100 - 2 * 10 <= cloud <= 100, f"$1 at $0.01 a request, blocks of 10: {seen}"
    assert spent == pytest.approx(cloud * 0.01)
    assert seen[("aws", "0")] + seen[("aws", "1")] == cloud


@needs_redis
@pytest.mark.integration
def test_outcomes_go_back_to_the_worker_that_decided(tmp_path: Path) -> None:
    cap = {
        "targets": [
            {"name": "aws", "kind": "aws_lambda", "url": "https://aws.example/", "concurrency_cap": 4}
        ]
    }
    with two_workers(tmp_path, **cap) as workers:
        seen = fill_to_the_cap(workers, 4)
        sent = {w: seen[("aws", w)] for w in ("0", "1")}
        workers.report(
            [
                {"target": AWS, "upstream_status": "200", "upstream_s": "25", "worker": w}
                for w, n in sent.items()
                for _ in range(n)
            ]
        )
        for w in ("0", "1"):
            wait_until(
                lambda w=w: workers.metric(int(w), "spillway_target_in_flight", target="aws") == 0,
                30,
                "closed",
            )  # type: ignore[misc]
        fill_to_the_cap(workers, 4)  # the freed slots are used again
        failures = [{"target": AWS, "upstream_status": "502", "upstream_s": "0.01", "worker": "1"}] * 2
        workers.report(failures)
        wait_until(
            lambda: workers.metric(0, "spillway_breaker_open", target="aws") == 1, 30, "open on worker 0"
        )


@needs_redis
@pytest.mark.integration
def test_the_parent_restarts_a_dead_worker_forwards_reload_and_cleans_up(tmp_path: Path) -> None:
    with two_workers(tmp_path) as workers:
        children = subprocess.run(
            ["pgrep", "-P", str(workers.proc.pid)], capture_output=True, text=True, check=True
        ).stdout.split()
        assert len(children) == 2
        os.kill(int(children[0]), signal.SIGKILL)
        wait_until(lambda: "starting it again" in workers.log(), 30, "restart")
        wait_until(workers.serving, 60, "both workers serving again")
        assert sum(asyncio.run(wave(workers.sock, 20)).values()) == 20
        workers.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: workers.log().count("config reloaded") == 2, 30, "both workers reloaded")
        workers.proc.send_signal(signal.SIGTERM)
        assert workers.proc.wait(30) == 0
        assert not workers.sock.exists(), "the socket is removed on exit"


@needs_redis
@pytest.mark.integration
def test_workers_stop_when_their_parent_is_killed(tmp_path: Path) -> None:
    with two_workers(tmp_path) as workers:
        children = subprocess.run(
            ["pgrep", "-P", str(workers.proc.pid)], capture_output=True, text=True, check=True
        ).stdout.split()
        workers.proc.kill()
        workers.proc.wait(10)
        for child in children:
            wait_until(
                lambda child=child: not Path(f"/proc/{child}").exists() or _zombie(child), 30, "worker gone"
            )  # type: ignore[misc]
        assert workers.log().count("the parent of the workers is gone") == 2


def _zombie(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_worker_header_of_any_text_sends_the_outcome_to_worker_zero() -> None:
    """A stop never reaches the upstream, so http-logger logs the client's own header there."""
    fan_out = OutcomeFanOut(2)
    fan_out.deliver([{"worker": value} for value in ("\u00b2", "\u0661", "7", "x", "1")])
    assert fan_out.dropped == 2, "one batch for worker 0, one for worker 1, neither running"


@needs_redis
@pytest.mark.integration
def test_a_worker_that_stops_answering_is_killed_and_started_again(tmp_path: Path) -> None:
    """A worker alive but serving nobody (here stopped with SIGSTOP; a blocked event loop looks the
    same) holds APISIX's calls until their 60 s timeout. Its parent hears no heartbeat for STALL_S,
    kills it (the calls it held end at once) and starts it again."""
    with two_workers(tmp_path) as workers:
        children = subprocess.run(
            ["pgrep", "-P", str(workers.proc.pid)], capture_output=True, text=True, check=True
        ).stdout.split()
        stopped = int(children[0])
        os.kill(stopped, signal.SIGSTOP)
        wait_until(lambda: "has not beaten" in workers.log(), 30, "the silent worker noticed")
        wait_until(lambda: _zombie(str(stopped)), 10, "the silent worker killed")
        wait_until(workers.serving, 60, "both workers serving again")
        assert sum(asyncio.run(wave(workers.sock, 20)).values()) == 20
        assert "starting it again" in workers.log()
