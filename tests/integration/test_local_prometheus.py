"""The on-prem members and their load read from a real Prometheus, which scrapes real tritonservers
through ``file_sd`` targets the test adds and removes, as Kubernetes service discovery adds and
removes pods: one PromQL query a round, a member per ``instance``."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from devtools import prometheus
from functions.sidecar import Sidecar, SidecarOptions, free_port
from gateway_plugin.app import http_fetcher
from gateway_plugin.config.cluster import PrometheusDiscovery
from gateway_plugin.signals.load import LoadTracker
from gateway_plugin.signals.members import MemberState
from gateway_plugin.signals.prometheus_load import (
    MemberDown,
    PrometheusAnswerError,
    PrometheusScraper,
    read_answer,
)
from testing.function import ADD_SUB_BODY
from testing.http import http, wait_until
from testing.paths import EXAMPLE_MODELS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(prometheus.missing_reason() is not None, reason=prometheus.missing_reason() or ""),
]


def _triton(tmp: Path) -> Sidecar:
    repo = tmp / "models"
    if not repo.exists():
        shutil.copytree(EXAMPLE_MODELS / "add_sub", repo / "add_sub")
    triton = Sidecar(SidecarOptions(repo, ("add_sub",), 60, metrics_port=free_port()))
    triton.start()
    triton.wait_ready(60)
    return triton


def _list(file_sd: Path, tritons: list[Sidecar]) -> None:
    targets = [f"127.0.0.1:{t.options.metrics_port}" for t in tritons]
    file_sd.write_text(json.dumps([{"targets": targets}]))


@pytest.fixture
def tritons(tmp_path: Path) -> Iterator[list[Sidecar]]:
    with ExitStack() as stack:
        started = []
        for i in range(2):
            triton = _triton(tmp_path / f"t{i}")
            stack.callback(triton.stop)
            started.append(triton)
        yield started


def test_members_come_and_go_with_prometheus_targets_and_their_work_is_read(
    tmp_path: Path, tritons: list[Sidecar]
) -> None:
    file_sd = tmp_path / "tritons.json"
    _list(file_sd, tritons)
    job = prometheus.Job("triton", (), file_sd=file_sd)
    with prometheus.running(free_port(), [job], tmp_path / "prom", interval_s=0.5) as prom:
        spec = PrometheusDiscovery(url=prom.url, selector='job="triton"', max_age_s=5)
        tracker = LoadTracker(5.0, member_parallelism=1)
        scraper = PrometheusScraper(tracker, http_fetcher(2.0), spec, 0.25, time.time)

        def live(count: int) -> bool:
            asyncio.run(scraper.scrape_once())
            return tracker.live == count and tracker.capacity == count

        wait_until(lambda: live(2), 60, "both Tritons read through Prometheus")
        for _ in range(20):
            status, _, _ = http(
                "POST", f"http://127.0.0.1:{tritons[0].http_port}/v2/models/add_sub/infer", ADD_SUB_BODY
            )
            assert status == 200

        def worked() -> bool:
            asyncio.run(scraper.scrape_once())
            return tracker.snapshot("add_sub")["add_sub"].compute_ms > 0

        wait_until(worked, 60, "the inferences' compute time read from Prometheus")

        _list(file_sd, tritons[:1])
        wait_until(lambda: live(1), 60, "the Triton Prometheus no longer scrapes gone")
        assert tracker.members.counts()[MemberState.DOWN] == 0, "gone, not down: no longer a member"

        _list(file_sd, tritons)
        wait_until(lambda: live(2), 60, "the Triton back")
        tritons[1].stop()

        def down() -> bool:
            asyncio.run(scraper.scrape_once())
            return tracker.members.counts()[MemberState.DOWN] == 1 and tracker.capacity == 1

        wait_until(down, 60, "the stopped Triton (up 0) dropped")


def test_an_answer_that_is_not_a_vector_is_refused_and_old_or_down_members_fail() -> None:
    spec = PrometheusDiscovery(url="http://127.0.0.1:9090", max_age_s=10)
    with pytest.raises(PrometheusAnswerError, match="no instant vector"):
        read_answer('{"status": "error", "error": "bad query"}', spec, 100.0)

    def series(name: str, instance: str, at: float, value: float) -> dict[str, object]:
        return {"metric": {"__name__": name, "instance": instance, "model": "m"}, "value": [at, str(value)]}

    body = json.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    series("up", "a:8002", 99, 1),
                    series("nv_inference_request_success", "a:8002", 99, 7),
                    series("up", "b:8002", 99, 0),
                    series("nv_inference_request_success", "c:8002", 50, 7),
                    {"metric": "junk"},
                ],
            },
        }
    )
    answers, samples, newest = read_answer(body, spec, 100.0)
    assert newest == {"a:8002": 99, "b:8002": 99, "c:8002": 50}
    assert not isinstance(answers["a:8002"], BaseException) and answers["a:8002"]["m"].success == 7
    assert isinstance(answers["b:8002"], MemberDown) and "up is 0" in str(answers["b:8002"])
    assert isinstance(answers["c:8002"], MemberDown) and "50 s old" in str(answers["c:8002"])
    assert len(samples) == 1
