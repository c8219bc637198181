"""Three real runner processes (``python -m gateway_plugin run``) sharing one real redis-server.

Each runner gets its own socket, metrics and outcome endpoint, as three APISIX nodes would; the
test talks APISIX's side of the protocol to each (``devtools.apisix_peer``) and reports outcomes to
a runner the way the route's http-logger does. Rules send every public request to the cloud
target ``aws`` (upstream mode: the decision is the Rewrite's ``X-Spillway-Target``), so what is
measured is the shared budget, cap and breaker, not the load signals.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devtools.apisix_peer import ApisixPeer, Outcome, PeerRequest, RouteConf
from functions.sidecar import free_port
from gateway_plugin.books.outcomes import auth_header
from gateway_plugin.books.target_header import target_value
from testing.budget import clear_of_the_hours_end
from testing.http import http, wait_until
from testing.paths import ROOT
from testing.redis import RedisServer, needs_redis, redis_server

pytestmark = [pytest.mark.integration, needs_redis]

ROUTE = RouteConf("route#spillway", [("spillway", "{}")])
TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
AWS = target_value("aws", TOKEN)
COST_USD = 0.01


def request(classification: str = "public") -> PeerRequest:
    return PeerRequest("POST", "/v2/models/m/infer", headers=[("x-data-classification", classification)])


def config(url: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "targets": [
            {
                "name": "aws",
                "kind": "aws_lambda",
                "url": "https://aws.example/",
                "concurrency_cap": 1000,
                "timeout_s": 300,
                "cost": {"usd_per_request": COST_USD, "usd_per_gb_second": 0, "billed_init": False},
            }
        ],
        "rules": [{"name": "out", "action": "target", "targets": ["aws"]}],
        "breaker": {"consecutive_failures": 2, "cooldown_s": 60},
        "shared_state": {"redis_url": url, "nodes_expected": 3, "sync_period_ms": 50, "timeout_ms": 200},
    }
    base.update(extra)
    return base


@dataclass
class Runner:
    sock: Path
    metrics_port: int
    outcomes_port: int
    proc: subprocess.Popen[bytes]

    def metric(self, name: str, **labels: str) -> float:
        _, _, body = http("GET", f"http://127.0.0.1:{self.metrics_port}/metrics")
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0

    def report(self, entries: list[dict[str, str]]) -> None:
        headers = {"authorization": auth_header(TOKEN), "content-type": "application/json"}
        url = f"http://127.0.0.1:{self.outcomes_port}/spillway/outcomes"
        status, _, body = http("POST", url, json.dumps(entries).encode(), headers)
        assert status == 204, body


def connected(running: Runner) -> bool:
    """The runner's metrics say it reached the shared store (its endpoint starts after its socket)."""
    try:
        return running.metric("spillway_shared_state_connected") == 1
    except OSError:
        return False


@contextmanager
def runner(tmp: Path, name: str, cfg: dict[str, Any]) -> Iterator[Runner]:
    folder = tmp / name
    folder.mkdir()
    metrics_port, outcomes_port = free_port(), free_port()
    cfg = {
        **cfg,
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        "outcomes": {"listen": f"127.0.0.1:{outcomes_port}"},
    }
    (folder / "spillway.yaml").write_text(yaml.safe_dump(cfg))
    sock = folder / "runner.sock"
    log = (folder / "runner.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway_plugin", "run", "--config", str(folder / "spillway.yaml")],
        cwd=ROOT,
        env={**os.environ, "APISIX_LISTEN_ADDRESS": f"unix:{sock}"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    running = Runner(sock, metrics_port, outcomes_port, proc)
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, 30, f"runner {name}")
        assert proc.poll() is None, (folder / "runner.log").read_text()
        wait_until(lambda: connected(running), 30, "shared state")
        yield running
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


@contextmanager
def three_runners(tmp: Path, cfg: dict[str, Any]) -> Iterator[list[Runner]]:
    with ExitStack() as stack:
        yield [stack.enter_context(runner(tmp, f"node{i}", cfg)) for i in range(3)]


def to_aws(outcome: Outcome) -> bool:
    """Whether the runner sent the request to the cloud; any answer but a Rewrite is a failure."""
    assert outcome.rewrite is not None, outcome
    return dict(outcome.rewrite.headers)["x-spillway-target"] == AWS


async def wave(runners: list[Runner], per_node: int, classification: str = "public") -> list[int]:
    """``per_node`` concurrent requests on every node at once; the cloud decisions per node."""

    async def node(r: Runner) -> int:
        peer = ApisixPeer(r.sock, pool_size=16, timeout_s=10)
        try:
            answers = await asyncio.gather(
                *(peer.request(ROUTE, request(classification)) for _ in range(per_node))
            )
        finally:
            await peer.close()
        return sum(to_aws(a) for a in answers)

    return list(await asyncio.gather(*(node(r) for r in runners)))


def rounds(r: Runner) -> float:
    return r.metric("spillway_shared_state_rounds_total")


def after_a_round_each(runners: list[Runner]) -> None:
    """Wait until every runner has completed a round that began after now (two completed rounds)."""
    start = [rounds(r) for r in runners]
    for r, seen in zip(runners, start, strict=True):
        wait_until(lambda r=r, seen=seen: rounds(r) >= seen + 2, 30, "a shared-state round")  # type: ignore[misc]


def test_a_global_hourly_budget_holds_under_concurrent_cloud_decisions(tmp_path: Path) -> None:
    clear_of_the_hours_end()
    with redis_server(tmp_path / "redis") as server:
        cfg = config(server.url, budgets={"per_target_hourly_usd": {"aws": 1.0}})
        with three_runners(tmp_path, cfg) as runners:
            sent = [0, 0, 0]
            for _ in range(20):
                got = asyncio.run(wave(runners, 40))
                sent = [a + b for a, b in zip(sent, got, strict=True)]
                if sum(got) == 0:
                    after_a_round_each(runners)
                    if sum(asyncio.run(wave(runners, 40))) == 0:
                        break
            assert sum(asyncio.run(wave(runners, 40, "confidential"))) == 0, "residency holds"
            spent = sum(r.metric("spillway_cloud_spend_usd_total", target="aws") for r in runners)
    block = 2  # lease_share 0.02 of $1 at $0.01 a request: leases of two requests
    assert 100 - 3 * block <= sum(sent) <= 100, f"cloud decisions per node {sent}: $1 at $0.01 each"
    assert spent == pytest.approx(sum(sent) * COST_USD)


def test_a_global_concurrency_cap_holds(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        cfg = config(server.url)
        cfg["targets"][0]["concurrency_cap"] = 6
        with three_runners(tmp_path, cfg) as runners:
            sent = [0, 0, 0]
            for _ in range(6):
                got = asyncio.run(wave(runners, 20))
                sent = [a + b for a, b in zip(sent, got, strict=True)]
                after_a_round_each(runners)
            assert sum(sent) == 6, f"unanswered cloud requests per node {sent}, cap 6"
            busiest = max(range(3), key=lambda i: sent[i])
            runners[busiest].report(
                [{"target": AWS, "upstream_status": "200", "upstream_s": "0.05"}] * sent[busiest]
            )
            after_a_round_each(runners)
            # Each node asks for a slot more a round: waves, a round between them, until the
            # slots freed are filled again, and never one more.
            more, deadline = [0, 0, 0], time.monotonic() + 30
            while sum(more) < sent[busiest] and time.monotonic() < deadline:
                got = asyncio.run(wave(runners, 20))
                more = [a + b for a, b in zip(more, got, strict=True)]
                assert sum(more) <= sent[busiest], f"no more than the slots freed: {more}"
                after_a_round_each(runners)
            assert sum(more) == sent[busiest], f"the slots freed went to some node: {more}"


def test_a_breaker_opened_on_one_node_keeps_the_others_off_after_their_next_round(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server, three_runners(tmp_path, config(server.url)) as (a, b, c):
        assert asyncio.run(wave([a, b, c], 3)) == [3, 3, 3]
        a.report([{"target": AWS, "upstream_status": "502", "upstream_s": "0.05"}] * 2)
        store = redis.Redis(port=server.port)
        wait_until(lambda: int(store.hget("{spillway}:breaker:aws", "until") or 0) > 0, 30, "open")
        after_a_round_each([b, c])
        assert asyncio.run(wave([a, b, c], 10)) == [0, 0, 0], "open on every node"
        for r in (a, b, c):
            wait_until(lambda r=r: r.metric("spillway_breaker_open", target="aws") == 1, 30, "gauge")  # type: ignore[misc]


async def killed_during(server: RedisServer, runners: list[Runner], waves: int = 3) -> int:
    """Waves of requests on every node, Redis killed while the second one is in flight."""
    first_done = asyncio.Event()

    async def traffic() -> int:
        sent = 0
        for _ in range(waves):
            sent += sum(await wave(runners, 40))
            first_done.set()
        return sent

    async def kill() -> None:
        await first_done.wait()
        await asyncio.to_thread(server.stop)

    sent, _ = await asyncio.gather(traffic(), kill())
    return sent


def test_redis_killed_mid_traffic_then_back(tmp_path: Path) -> None:
    """Redis killed while all three decide: no request waits or fails; each node spends at most its
    leases plus a third of what was left; Redis back (empty): each claims what it spent, once."""
    clear_of_the_hours_end(120)
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        cfg = config(server.url, budgets={"per_target_hourly_usd": {"aws": 3.0}})
        with three_runners(tmp_path, cfg) as runners:
            assert sum(asyncio.run(wave(runners, 20))) > 0, "spilling with leases"
            during = asyncio.run(killed_during(server, runners))
            for r in runners:
                wait_until(lambda r=r: r.metric("spillway_shared_state_connected") == 0, 30, "fallback")  # type: ignore[misc]
            for _ in range(3):
                during += sum(asyncio.run(wave(runners, 40)))
            unused = 3 * 9  # at most a block and a half unused per node (blocks of $0.06 at $0.01)
            assert during <= 300 + unused, "alone: unused leases plus a third of what was left, each"
            assert during > 0, "and they keep spilling with their shares"
            server.start()
            for r in runners:
                wait_until(lambda r=r: r.metric("spillway_shared_state_connected") == 1, 30, "back")  # type: ignore[misc]
            after_a_round_each(runners)
            spent = [r.metric("spillway_cloud_spend_usd_total", target="aws") for r in runners]
            hour = int(time.time() // 3600)
            fields = redis.Redis(port=server.port).hgetall(f"{{spillway}}:lease:target:aws:spend:h:{hour}")
            claimed = sorted(int(v) / 1e9 for v in fields.values())
    finally:
        server.stop()
    block = 0.06  # lease_share 0.02 of $3
    assert len(claimed) == 3
    for claim, own in zip(claimed, sorted(spent), strict=True):
        assert own - 1e-9 <= claim <= own + block + 1e-9, (
            f"claims {claimed} for spend {spent}: each counted once"
        )
