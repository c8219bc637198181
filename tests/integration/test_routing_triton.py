"""Overflow routing against a real Triton: load rises, public requests spill, sensitive ones stay.

A real tritonserver runs the ``slow`` model (one instance, 60 ms per request); concurrent
tritonclient requests build its queue. The runner scrapes Triton's real metrics endpoint and is
driven over its Unix socket by the APISIX-side peer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from devtools.apisix_peer import ApisixPeer, PeerRequest, RouteConf
from functions.sidecar import Sidecar, SidecarOptions, free_port
from gateway_plugin.app import RunnerApp
from gateway_plugin.books import outcomes
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.runner import Runner, serve
from testing.paths import TEST_MODELS

pytestmark = pytest.mark.integration

ROUTE = RouteConf("route#spillway", [("spillway", "{}")])


def features(classification: str) -> PeerRequest:
    return PeerRequest("POST", "/v2/models/slow/infer", headers=[("x-data-classification", classification)])


def load(url: str, stop: threading.Event, delay_ms: float = 60) -> None:
    client = httpclient.InferenceServerClient(url, connection_timeout=30, network_timeout=30)
    tensor = httpclient.InferInput("DELAY_MS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([delay_ms], dtype=np.float32))
    while not stop.is_set():
        client.infer("slow", [tensor])


def test_overflow_follows_real_triton_load_and_residency_holds(tmp_path: Path) -> None:
    shutil.copytree(TEST_MODELS / "slow", tmp_path / "slow")
    metrics_port = free_port()
    triton = Sidecar(
        SidecarOptions(tmp_path, ("slow",), 30, metrics_port=metrics_port, log_prefix="[triton] ")
    )
    triton.start()
    triton.wait_ready(30)
    config = SpillwayConfig.model_validate(
        {
            "local": {
                "endpoints": [
                    {
                        "url": f"http://127.0.0.1:{triton.http_port}",
                        "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics",
                    }
                ],
                "latency_target_ms": 150,
                "scrape_period_s": 0.1,
                "stale_after_s": 1.0,
            },
            "targets": [
                {
                    "name": "aws",
                    "kind": "http",
                    "url": "https://fn.example",
                    "cold_start_ms": 50,
                    "signing_key_env": None,
                }
            ],
            # The on-prem-only requests sent to check residency take half the slow model's capacity:
            # the headroom they earn (tests/unit/test_policy_overflow.py) would keep every public
            # request out; this test follows the load the workers add.
            "overflow": {"saturation_ratio": 20, "onprem_headroom": 0},
            "metrics": {"listen": None},
        }
    )
    stop = threading.Event()
    timeline: list[tuple[str, str, str]] = []

    async def drive() -> None:
        app = RunnerApp(config)
        sock = tmp_path / "runner.sock"
        server = await serve(Runner(app.plugins), sock)
        app.start()
        peer = ApisixPeer(sock)

        async def decide(phase: str, classification: str) -> str:
            outcome = await peer.request(ROUTE, features(classification))
            assert outcome.status is None, outcome
            target = dict(outcome.rewrite.headers)["x-spillway-target"] if outcome.rewrite else "shed"
            timeline.append((phase, classification, target.partition(":")[0]))
            # What the route's http-logger reports: the answer closes the request's books.
            if target != "shed":
                outcomes.apply(
                    app.state, [outcomes.Outcome(target=target, upstream_status="200", instance="fn-1")]
                )
            return target

        async def sample(phase: str, seconds: float) -> None:
            """Decisions through a phase, five a second (its figures are shares of them)."""
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                await decide(phase, "public")
                await decide(phase, "confidential")
                await asyncio.sleep(0.2)

        async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
            try:
                async with asyncio.timeout(30):
                    # Polls what the runner decides (there is no event to wait on).
                    while not await check():  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
            except TimeoutError:
                raise TimeoutError(f"{what} not within 30 s") from None

        async def fresh() -> bool:
            return app.state.load.fresh

        async def drained() -> bool:
            return all(m.queue_ms == 0 and m.pending == 0 for m in app.state.load.snapshot("slow").values())

        async def public_goes(where: str) -> bool:
            return (await decide("between", "public")).partition(":")[0] == where

        try:
            await until(fresh, "the runner's first scrape of Triton's metrics")
            await sample("idle", 1.0)
            workers = [
                threading.Thread(target=load, args=(f"127.0.0.1:{triton.http_port}", stop)) for _ in range(8)
            ]
            for w in workers:
                w.start()
            await until(lambda: public_goes("aws"), "the queue the load builds seen by the runner")
            await sample("loaded", 3.0)
            stop.set()
            await asyncio.to_thread(lambda: [w.join(30) for w in workers])
            # The last requests to finish waited longest: a round's average says so a round after
            # the queue emptied. Drained is a round with nothing pending and nothing done.
            await until(drained, "the drained queue seen by the runner")
            await until(lambda: public_goes("local"), "public requests local again")
            await sample("after", 2.0)
        finally:
            stop.set()
            await peer.close()
            app.close()
            server.close()

    try:
        asyncio.run(drive())
    finally:
        triton.stop()

    def targets(phase: str, classification: str) -> list[str]:
        return [t for p, c, t in timeline if p == phase and c == classification]

    assert set(targets("idle", "public")) == {"local"}
    assert set(targets("loaded", "confidential")) == {"local"}, "sensitive data left the premises"
    loaded = targets("loaded", "public")
    assert loaded.count("aws") > 0.8 * len(loaded), f"public requests did not spill: {loaded}"
    after = targets("after", "public")
    assert set(after) == {"local"}, f"did not come back local: {after}"
    flips = sum(1 for a, b in itertools.pairwise(loaded) if a != b)
    assert flips <= 2, f"overflow flapped under steady load: {loaded}"
    print(json.dumps({"idle": len(targets("idle", "public")), "loaded_public": loaded}))
