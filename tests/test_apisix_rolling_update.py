"""A rolling update of three real tritonservers behind a real Apache APISIX 3.18, both routes, while
public and on-prem-only traffic runs at about twice what the cluster can serve.

Each member runs the ``slow`` model (one instance, 100 ms a request: 10 requests a second, so
three make 30) and is replaced one at a time as a Deployment's rollout does: stopped (its
inference and metrics ports close), then started again on the same ports. The cloud target is a
loopback stand-in. Public traffic must keep spilling through every phase, more while a member is
away (before, the scrape round failed whole and every request stayed home once the signals went
stale); no public request fails; no on-prem-only request leaves. The shares are printed.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devtools import apisix
from functions.sidecar import Sidecar, SidecarOptions, free_port
from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from tests.apisix_support import fast_path_settings, needs_apisix, upstream
from tests.support import TEST_MODELS, http, wait_until

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
FAST = "fast.test"
PATH = "/v2/models/slow/infer"
BODY = json.dumps(
    {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "FP32", "data": [100]}]}
).encode()
# Clients sending one request after another: about twice the 30 a second three members serve.
CLIENTS = 8


@dataclass
class Member:
    repo: Path
    http_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    server: Sidecar | None = None

    def start(self) -> None:
        options = SidecarOptions(
            self.repo, ("slow",), 60, http_port=self.http_port, metrics_port=self.metrics_port, log_prefix=""
        )
        self.server = Sidecar(options)
        self.server.start()
        self.server.wait_ready(60)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@dataclass
class Load:
    url: str
    host: str | None
    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[tuple[float, bool, int, str]] = field(default_factory=list)

    def client(self, index: int) -> None:
        public = index % 4 != 0  # a quarter of the clients send on-prem-only requests
        headers = {"content-type": "application/json"}
        if public:
            headers["x-data-classification"] = "public"
        if self.host is not None:
            headers["host"] = self.host
        while not self.stop.is_set():
            status, answer, _ = http("POST", self.url, BODY, headers, timeout=60)
            self.answers.append((time.monotonic(), public, status, answer.get("x-spillway-decision", "")))

    def phase(self, since: float) -> dict[str, float]:
        public = [a for a in list(self.answers) if a[0] >= since and a[1]]
        onprem = [a for a in list(self.answers) if a[0] >= since and not a[1]]
        return {
            "public": len(public),
            "spilled": sum(a[3].startswith("aws;") for a in public) / max(1, len(public)),
            "public_failed": sum(a[2] >= 500 for a in public),
            "onprem_out": sum(a[3].startswith("aws;") for a in onprem),
        }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[apisix.Apisix, list[Member]]]:
    tmp = tmp_path_factory.mktemp("apisix-rolling")
    repo = tmp / "models"
    shutil.copytree(TEST_MODELS / "slow", repo / "slow")
    with ExitStack() as stack:
        members = [Member(repo) for _ in range(3)]
        for member in members:
            member.start()
            stack.callback(member.stop)
        aws = stack.enter_context(upstream("aws", instance="fn-1"))
        config = {
            "local": {
                "endpoints": [
                    {
                        "url": f"http://127.0.0.1:{m.http_port}",
                        "metrics_url": f"http://127.0.0.1:{m.metrics_port}/metrics",
                    }
                    for m in members
                ],
                "member_parallelism": 1,
                "drop_member_after_s": 0.5,
                "latency_target_ms": 400,
                "scrape_period_s": 0.2,
                "stale_after_s": 1.0,
            },
            "targets": [
                {"name": "aws", "kind": "http", "url": aws.url, "cold_start_ms": 0, "concurrency_cap": 1000}
            ],
            "metrics": {"listen": f"127.0.0.1:{free_port()}"},
            "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
        }
        validated = SpillwayConfig.model_validate(config)
        routes = [route(validated, TOKEN), {**fast_route(validated, TOKEN), "hosts": [FAST]}]
        gateway = stack.enter_context(apisix.running(fast_path_settings(config, tmp, free_port(), routes)))
        yield gateway, members


@pytest.mark.parametrize("host", [None, FAST], ids=["ext-plugin", "fast-path"])
def test_public_traffic_keeps_spilling_through_a_rolling_update(
    cluster: tuple[apisix.Apisix, list[Member]], host: str | None
) -> None:
    gateway, members = cluster
    load = Load(gateway.url + PATH, host)
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        running = [pool.submit(load.client, i) for i in range(CLIENTS)]
        try:
            wait_until(
                lambda: load.phase(time.monotonic() - 2)["spilled"] > 0.2, 60, "spilling at twice the load"
            )
            phases: list[tuple[str, dict[str, float]]] = []
            start = time.monotonic()
            time.sleep(4)
            phases.append(("3 members", load.phase(start)))
            for index, member in enumerate(members):
                member.stop()
                start = time.monotonic()
                time.sleep(4)
                phases.append((f"member {index} away", load.phase(start)))
                member.start()
                start = time.monotonic()
                time.sleep(3)
                phases.append((f"member {index} back", load.phase(start)))
        finally:
            load.stop.set()
            for future in running:
                future.result()
    for name, figures in phases:
        print(f"{host or 'ext-plugin'}: {name}: {figures}")
    everyone = phases[0][1]["spilled"]
    for name, figures in phases:
        assert figures["public"] > 10, (name, figures)
        assert figures["onprem_out"] == 0, (name, figures)
        assert figures["public_failed"] == 0, (name, figures)
        if name.endswith("away"):
            assert figures["spilled"] >= everyone - 0.1, (name, figures, everyone)
