"""Three real tritonservers behind a real Apache APISIX 3.18, replaced one at a time as a
Deployment's rollout does, under closed-loop clients: what the rolling-update test and
``bench/rolling_update.py`` share.

Each member runs the ``slow`` model (one instance, ``DELAY_MS`` a request: 100 ms here, so 10
requests a second, 30 for three). Both routes stand on one APISIX: the ext-plugin route, and the
fast path's on the host ``FAST``. The cloud target is a loopback stand-in named ``aws``.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools import apisix
from functions.sidecar import Sidecar, SidecarOptions, free_port
from testing.apisix import FAST_HOST, both_routes, gateway_for
from testing.http import http
from testing.paths import TEST_MODELS
from testing.standins import Upstream, upstream

CLOUD = "aws"
FAST = FAST_HOST
PATH = "/v2/models/slow/infer"
COMPUTE_MS = 100
BODY = json.dumps(
    {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "FP32", "data": [COMPUTE_MS]}]}
).encode()
# The config the cluster runs under (``local``; ``rolling_cluster`` may change any of it).
LOCAL = {
    "member_parallelism": 1,
    "drop_member_after_s": 0.5,
    "latency_target_ms": 400,
    "scrape_period_s": 0.2,
    "stale_after_s": 1.0,
}


@dataclass
class Member:
    """One tritonserver on ports of its own, which it keeps across a stop and a start (a pod
    replaced behind the same Service address). ``log_path``: its log there, not on stderr;
    ``host``: the loopback address it listens on (a pod's own, where several share the ports)."""

    repo: Path
    http_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    log_path: Path | None = None
    host: str = "127.0.0.1"
    server: Sidecar | None = None

    def start(self, wait: bool = True) -> None:
        """Start it; ``wait``: until it is ready (else ``wait_ready``, to start several at once)."""
        options = SidecarOptions(
            self.repo,
            ("slow",),
            60,
            http_port=self.http_port,
            metrics_port=self.metrics_port,
            log_prefix="",
            log_path=self.log_path,
            host=self.host,
        )
        self.server = Sidecar(options)
        self.server.start()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        assert self.server is not None
        self.server.wait_ready(60)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@dataclass(frozen=True)
class Answer:
    """One request as its client saw it: when the answer came (``time.monotonic``), whether it
    was public, its status (0: no answer at all), the gateway's decision header and how long the
    client waited."""

    at: float
    public: bool
    status: int
    decision: str
    latency_s: float

    @property
    def left(self) -> bool:
        return self.decision.startswith(CLOUD + ";")

    @property
    def local(self) -> bool:
        """Answered by an on-prem member."""
        return self.status == 200 and self.decision.startswith("local")


@dataclass
class Load:
    """Closed-loop clients (one request after another): every fourth one sends on-prem-only
    requests (no classification header), the others ``x-data-classification: public``."""

    url: str
    host: str | None
    timeout_s: float = 60.0
    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[Answer] = field(default_factory=list)

    def client(self, index: int) -> None:
        public = index % 4 != 0
        headers = {"content-type": "application/json"}
        if public:
            headers["x-data-classification"] = "public"
        if self.host is not None:
            headers["host"] = self.host
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                status, answer, _ = http("POST", self.url, BODY, headers, timeout=self.timeout_s)
            except OSError:
                status, answer = 0, {}
            done = time.monotonic()
            self.answers.append(
                Answer(done, public, status, answer.get("x-spillway-decision", ""), done - started)
            )

    def between(self, since: float, until: float = math.inf) -> list[Answer]:
        return [a for a in list(self.answers) if since <= a.at < until]

    def phase(self, since: float) -> dict[str, float]:
        """Of the requests sent since ``since``: public ones, the share of them that left, those
        that failed (5xx or no answer), on-prem-only ones that left, and requests of either kind
        that got no answer at all. A request sent before belongs to the phase before, whenever its
        answer came (a member stopping drops the requests it holds as it exits)."""
        answers = [a for a in list(self.answers) if a.at - a.latency_s >= since]
        public = [a for a in answers if a.public]
        return {
            "public": len(public),
            "spilled": sum(a.left for a in public) / max(1, len(public)),
            "public_failed": sum(a.status >= 500 or a.status == 0 for a in public),
            "onprem_out": sum(a.left for a in answers if not a.public),
            "unanswered": sum(a.status == 0 for a in answers),
        }


def cluster_config(members: list[Member], cloud_url: str, **local: Any) -> dict[str, Any]:
    return {
        "local": {
            "endpoints": [
                {
                    "url": f"http://127.0.0.1:{m.http_port}",
                    "metrics_url": f"http://127.0.0.1:{m.metrics_port}/metrics",
                }
                for m in members
            ],
            **LOCAL,
            **local,
        },
        "targets": [
            {"name": CLOUD, "kind": "http", "url": cloud_url, "cold_start_ms": 0, "concurrency_cap": 1000}
        ],
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
    }


@contextmanager
def rolling_cluster(
    tmp: Path, member_logs: bool = False, **local: Any
) -> Iterator[tuple[apisix.Apisix, list[Member], Upstream]]:
    """Three members started, the cloud stand-in, and APISIX with both routes; all stopped after.
    ``member_logs``: the members' logs under ``tmp`` rather than on stderr."""
    repo = tmp / "models"
    shutil.copytree(TEST_MODELS / "slow", repo / "slow")
    with ExitStack() as stack:
        members = [Member(repo, log_path=tmp / f"member-{i}.log" if member_logs else None) for i in range(3)]
        for member in members:
            member.start()
            stack.callback(member.stop)
        cloud = stack.enter_context(upstream(CLOUD, instance="fn-1"))
        config = cluster_config(members, cloud.url, **local)
        running = stack.enter_context(gateway_for(config, tmp, both_routes(config), fast_path=True))
        yield running, members, cloud
