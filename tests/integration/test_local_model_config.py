"""Capacity from each member's own model configuration (``local.member_parallelism: model_config``).

A rollout may change what each pod runs, and pods of one Deployment may sit on nodes of different
GPU counts: the capacity the policy reads is then the sum of each member's instances of the model,
as its Triton's ``GET /v2/models/<model>/config`` says, read when the member joins or restarts.
The configuration's parsing is checked against real tritonservers (two members, one and three
instances) at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from functions.sidecar import Sidecar, SidecarOptions, free_port
from gateway_plugin.app import http_fetcher
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.explain import explain
from gateway_plugin.signals.load import LoadTracker
from gateway_plugin.signals.model_config import instances
from gateway_plugin.signals.scraper import Scraper
from testing.gateway import gateway_state
from testing.paths import TEST_MODELS
from tests.unit.test_local_members import Pod


@pytest.mark.parametrize(
    ("config", "count"),
    [
        ({"instance_group": [{"kind": "KIND_CPU", "count": 2, "gpus": []}]}, 2.0),
        ({"instance_group": [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1, 2]}]}, 6.0),
        ({"instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}, {"kind": "KIND_CPU"}]}, 2.0),
        ({"instance_group": [{"kind": "KIND_MODEL", "count": 4}]}, 4.0),
        ({"instance_group": [{"kind": "KIND_GPU", "count": 10**9, "gpus": [0]}]}, 10_000.0),
        ({"instance_group": []}, None),
        ({"instance_group": [{"count": -1}]}, None),
        ({"instance_group": [{"count": True}]}, None),
        ({"instance_group": [{"count": "2"}]}, None),
        ({"instance_group": "KIND_GPU"}, None),
        ({"instance_group": [3]}, None),
        ({}, None),
        ([], None),
    ],
)
def test_a_model_configurations_instances(config: object, count: float | None) -> None:
    assert instances(config) == count


class Member(Pod):
    """A pod whose Triton answers its model configuration too (``None``: it refuses to)."""

    def __init__(self, count: int | None) -> None:
        super().__init__(compute_ms=10)
        self.count = count
        self.asked = 0

    def config(self) -> str:
        self.asked += 1
        if self.count is None:
            raise ValueError("answered 400")
        return json.dumps(
            {"name": "m", "instance_group": [{"kind": "KIND_GPU", "count": self.count, "gpus": [0]}]}
        )


class Members:
    def __init__(self, pods: dict[str, Member]) -> None:
        self.pods = pods
        self.now = 100.0
        self.tracker = LoadTracker(2.0, lambda: self.now, from_model_config=True)  # type: ignore[arg-type]
        self.tracker.members.addressed({}, 8000)
        self.scraper = Scraper(self.tracker, self.fetch, list(pods), 0.25)

    async def fetch(self, url: str) -> str:
        host = url.split("//")[1].split(":")[0]
        pod = self.pods[f"http://{host}:8002/metrics"]
        return pod.config() if url.endswith("/v2/models/m/config") else pod.page()

    def round(self) -> float:
        self.now += 0.25
        asyncio.run(self.scraper.scrape_once())
        return self.tracker.snapshot("m")["m"].capacity


def test_capacity_is_each_members_instances_read_once_and_again_after_a_restart() -> None:
    pods = {"http://10.0.0.1:8002/metrics": Member(1), "http://10.0.0.2:8002/metrics": Member(3)}
    members = Members(pods)
    members.round()
    assert members.round() == 4.0
    for _ in range(5):
        members.round()
    assert [p.asked for p in pods.values()] == [1, 1], "read when it joins, not every round"
    second = pods["http://10.0.0.2:8002/metrics"]
    second.count = 2
    second.restart()
    members.round()
    assert members.round() == 3.0 and second.asked == 2, "a restarted member is read again"
    second.up = False
    members.round()
    members.now += 5
    assert members.round() == 1.0, "a member dropped takes its instances with it"


def test_a_member_whose_configuration_cannot_be_read_counts_one_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Triton's model-config API kept behind a header (``--http-restricted-api``) answers 403."""
    pods = {"http://10.0.0.1:8002/metrics": Member(2), "http://10.0.0.2:8002/metrics": Member(None)}
    members = Members(pods)
    with caplog.at_level(logging.WARNING, "spillway.signals"):
        for _ in range(4):
            capacity = members.round()
    assert capacity == 3.0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "10.0.0.2" in said[0] and "answered 400" in said[0], said


def test_model_config_needs_the_members_inference_port() -> None:
    base = {"member_parallelism": "model_config", "endpoints": []}
    for discovery, said in (
        ({"dns": {"name": "_metrics._tcp.triton", "record": "SRV"}}, "SRV records"),
        ({"prometheus": {"url": "http://127.0.0.1:9090"}}, "Prometheus members"),
    ):
        with pytest.raises(ValueError, match=said):
            SpillwayConfig.model_validate({"local": {**base, "discovery": discovery}})
    dns = SpillwayConfig.model_validate({"local": {**base, "discovery": {"dns": {"name": "triton"}}}})
    assert "read from its model configuration" in explain(dns)
    state = gateway_state(dns)
    assert state.load.from_model_config and state.load.member_parallelism == 0.0
    with pytest.raises(ValueError, match="member_parallelism"):
        SpillwayConfig.model_validate({"local": {"member_parallelism": "instances"}})


@pytest.fixture(scope="module")
def tritons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SidecarOptions]]:
    """Two real tritonservers serving ``slow``, with one instance and with three."""
    tmp = tmp_path_factory.mktemp("model-config")
    with ExitStack() as stack:
        started = []
        for count in (1, 3):
            repo = tmp / f"models-{count}"
            shutil.copytree(TEST_MODELS / "slow", repo / "slow")
            config = repo / "slow" / "config.pbtxt"
            config.write_text(config.read_text().replace("count: 1", f"count: {count}"))
            options = SidecarOptions(
                Path(repo),
                ("slow",),
                60,
                http_port=free_port(),
                metrics_port=free_port(),
                log_prefix="",
                expose_model_config=True,
            )
            server = Sidecar(options)
            server.start()
            stack.callback(server.stop)
            started.append((server, options))
        for server, _ in started:
            server.wait_ready(60)
        yield [options for _, options in started]


@pytest.mark.integration
def test_real_tritons_configurations_give_the_capacity(tritons: list[SidecarOptions]) -> None:
    config = SpillwayConfig.model_validate(
        {
            "local": {
                "endpoints": [
                    {
                        "url": f"http://127.0.0.1:{o.http_port}",
                        "metrics_url": f"http://127.0.0.1:{o.metrics_port}/metrics",
                    }
                    for o in tritons
                ],
                "member_parallelism": "model_config",
            }
        }
    )
    state = gateway_state(config)
    scraper = Scraper(state.load, http_fetcher(5.0), [e.metrics_url for e in config.local.endpoints], 0.25)
    for _ in range(2):
        assert asyncio.run(scraper.scrape_once())
    assert state.load.snapshot("slow")["slow"].capacity == 4.0
