"""The on-prem cluster going down on a real Apache APISIX 3.18 in front of a real Triton: public
traffic must not go down with it.

A real tritonserver (the pytriton wheel's) serves ``add_sub``; its process group is killed
mid-traffic (the kernel closes its ports: inference and metrics both refuse connections), then a
new one is started on the same ports. The cloud target is a loopback stand-in that answers as a
function would (no function platform runs here). On both the ext-plugin route (the runner
decides) and the fast path (the Lua plugin decides from the runner's table): once the failures
reach the runner, requests that may leave are answered by the cloud target, on-prem-only ones
get 503 with Retry-After at once (never a hang, never the cloud), and with Triton back traffic
comes home. The times are measured and printed, not asserted against a threshold.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import apisix
from functions.sidecar import Sidecar, SidecarOptions, free_port
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from testing.apisix import gateway_for, needs_apisix
from testing.function import ADD_SUB_BODY, model_repository
from testing.http import http, wait_until
from testing.standins import upstream

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
URL_PATH = "/v2/models/add_sub/infer"


@dataclass
class Answer:
    at: float
    public: bool
    status: int
    decision: str
    retry_after: str | None
    by_cloud: bool
    seconds: float


@dataclass
class Traffic:
    """Public and on-prem-only requests, one after the other, until stopped; every answer kept."""

    url: str
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def send(self, public: bool) -> Answer:
        headers = {"content-type": "application/json"}
        if public:
            headers["x-data-classification"] = "public"
        started = time.monotonic()
        status, answer_headers, body = http("POST", self.url, ADD_SUB_BODY, headers, timeout=60)
        return Answer(
            started,
            public,
            status,
            answer_headers.get("x-spillway-decision", ""),
            answer_headers.get("retry-after"),
            b'"upstream": "aws"' in body,
            time.monotonic() - started,
        )

    def run(self) -> None:
        public = True
        while not self.stop.is_set():
            self.answers.append(self.send(public))
            public = not public

    def since(self, at: float, public: bool) -> list[Answer]:
        return [a for a in list(self.answers) if a.at >= at and a.public is public]

    def settled(self, at: float, public: bool, good: Callable[[Answer], bool], what: str) -> Answer:
        """The first answer since ``at`` from which six in a row are good, once there is one."""
        wait_until(lambda: first_of_a_run(self.since(at, public), good) is not None, 60, what)
        found = first_of_a_run(self.since(at, public), good)
        assert found is not None
        return found


def triton(repo: Path, http_port: int, metrics_port: int) -> Sidecar:
    server = Sidecar(
        SidecarOptions(
            repo, ("add_sub",), 60, http_port=http_port, metrics_port=metrics_port, log_prefix="[triton] "
        )
    )
    server.start()
    server.wait_ready(60)
    return server


def kill(server: Sidecar) -> None:
    """SIGKILL to Triton's process group, as a crash would; then its supervisor is stopped so
    that only the test brings it back."""
    assert server.pid is not None
    os.killpg(server.pid, signal.SIGKILL)
    server.stop()


def config_for(http_port: int, metrics_port: int, aws_url: str) -> dict[str, Any]:
    return {
        "local": {
            "endpoints": [
                {
                    "url": f"http://127.0.0.1:{http_port}",
                    "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics",
                }
            ],
            "latency_target_ms": 2000,
            "scrape_period_s": 0.2,
            "stale_after_s": 1.0,
        },
        "targets": [
            {
                "name": "aws",
                "kind": "http",
                "url": aws_url,
                "signing_key_env": None,
                "cold_start_ms": 3000,
                "concurrency_cap": 100,
            }
        ],
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
    }


def gateway(path: str, config: dict[str, Any], tmp: Path) -> AbstractContextManager[apisix.Apisix]:
    if path == "runner":
        return gateway_for(config, tmp)
    made = fast_route(SpillwayConfig.model_validate(config), TOKEN)
    return gateway_for(config, tmp, [yaml.safe_load(yaml.safe_dump(made))], fast_path=True)


def first_of_a_run(answers: list[Answer], good: Callable[[Answer], bool], run: int = 6) -> Answer | None:
    """The first answer from which ``run`` answers in a row are all good."""
    for i in range(len(answers) - run + 1):
        if all(good(a) for a in answers[i : i + run]):
            return answers[i]
    return None


@pytest.mark.parametrize("path", ["runner", "fast_path"])
def test_a_dead_cluster_sends_public_traffic_out_sheds_onprem_only_at_once_and_comes_home(
    path: str, tmp_path: Path
) -> None:
    repo = model_repository(tmp_path, "add_sub")
    http_port, metrics_port = free_port(), free_port()
    with ExitStack() as stack:
        server = triton(repo, http_port, metrics_port)
        stack.callback(lambda: server.stop())
        aws = stack.enter_context(upstream("aws", instance="fn-1"))
        config = config_for(http_port, metrics_port, aws.url)
        running = stack.enter_context(gateway(path, config, tmp_path))
        traffic = Traffic(running.url + URL_PATH)
        home = traffic.send(True)
        wait_until(lambda: traffic.send(True).decision.startswith("local;local_ok"), 60, "public at home")
        sender = threading.Thread(target=traffic.run, daemon=True)
        sender.start()
        stack.callback(sender.join)
        stack.callback(traffic.stop.set)
        wait_until(lambda: len(traffic.since(home.at, False)) >= 4, 30, "traffic flowing home")
        assert all(a.status == 200 and not a.by_cloud for a in traffic.since(home.at, True)), traffic.answers

        killed = time.monotonic()
        kill(server)

        def out(a: Answer) -> bool:
            return a.status == 200 and a.by_cloud and a.decision.startswith("aws;")

        failover = traffic.settled(killed, True, out, "public answered out")
        failover_s = failover.at + failover.seconds - killed

        def shed(a: Answer) -> bool:
            return a.status == 503 and a.retry_after is not None and "local_failing" in a.decision

        shed_from = traffic.settled(killed, False, shed, "on-prem-only shed")
        onprem = traffic.since(killed, False)
        assert not any(a.by_cloud or a.decision.startswith("aws;") for a in onprem), onprem
        while_down = [a for a in onprem if a.at >= shed_from.at]
        assert all(shed(a) for a in while_down), while_down

        restarted = time.monotonic()
        server = triton(repo, http_port, metrics_port)
        ready = time.monotonic()

        def at_home(a: Answer) -> bool:
            return a.status == 200 and not a.by_cloud and a.decision.startswith("local;")

        back = traffic.settled(ready, True, at_home, "public home")
        traffic.settled(ready, False, at_home, "on-prem-only home")
        recovery_s = back.at + back.seconds - ready
        traffic.stop.set()
        sender.join(60)
        after = traffic.since(killed, False)
        assert not any(a.by_cloud for a in after), after
        lost = [a for a in traffic.since(killed, True) if a.at < failover.at and a.status != 200]
        first_503 = shed_from.at + shed_from.seconds - killed
        print(
            f"\n[{path}] public answered by the cloud {failover_s:.2f} s after the kill ({len(lost)} "
            f"public requests failed before), on-prem-only 503 from {first_503:.2f} s (slowest "
            f"{max(a.seconds for a in while_down) * 1000:.0f} ms); Triton restarted in "
            f"{ready - restarted:.2f} s; traffic home {recovery_s:.2f} s after it was ready"
        )
