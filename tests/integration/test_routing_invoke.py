"""Invoke mode end to end: runner → boto3 / aliyun-fc2 (real signing) → signature-checking stand-in
of the cloud API → the real function with its real Triton sidecar. Breakers, reload, fail-safes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.apisix_peer import ApisixPeer, Outcome, PeerRequest, RouteConf
from gateway_plugin.app import RunnerApp
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.runner import Runner, serve
from testing.cloud_apis import AWS_KEY, AWS_SECRET, FC_KEY, FC_SECRET, REGION, CloudFake, cloud_fake
from testing.function import ADD_SUB_BODY, Running, function_server, model_repository

pytestmark = pytest.mark.integration

ROUTE = RouteConf("route#spillway", [("spillway", "{}")])


@pytest.fixture(scope="module")
def function(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("fn")
    with function_server(model_repository(tmp, "add_sub"), tmp) as running:
        yield running


@pytest.fixture
def cloud(function: Running, monkeypatch: pytest.MonkeyPatch) -> Iterator[CloudFake]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", FC_KEY)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", FC_SECRET)
    with cloud_fake(function.url) as fake:
        yield fake


def config_for(fake: CloudFake, **extra: Any) -> dict[str, Any]:
    return {
        "targets": [
            {
                "name": "aws",
                "kind": "aws_lambda",
                "mode": "invoke",
                "function_name": "spillway-infer",
                "qualifier": "live",
                "region": REGION,
                "endpoint_url": fake.url,
                "timeout_s": 1.5,
                "signing_key_env": None,
            },
            {
                "name": "ali",
                "kind": "aliyun_fc",
                "mode": "invoke",
                "service_name": "spillway",
                "function_name": "infer",
                "region": "cn-hangzhou",
                "endpoint_url": fake.url,
                "timeout_s": 1.5,
                "signing_key_env": None,
            },
        ],
        "rules": [
            {
                "name": "to-aws",
                "match": {"headers": {"x-want": "aws"}},
                "action": "target",
                "targets": ["aws"],
            },
            {
                "name": "to-ali",
                "match": {"headers": {"x-want": "ali"}},
                "action": "target",
                "targets": ["ali"],
            },
        ],
        "breaker": {"consecutive_failures": 2, "cooldown_s": 0.5, "retry_budget_ratio": 1.0},
        "metrics": {"listen": None},
        **extra,
    }


def infer(want: str, classification: str = "public") -> PeerRequest:
    return PeerRequest(
        "POST",
        "/v2/models/add_sub/infer",
        headers=[
            ("x-want", want),
            ("x-data-classification", classification),
            ("content-type", "application/json"),
        ],
        body=ADD_SUB_BODY,
    )


class Clock:
    """Monotonic time the test moves on, so no test waits out a cooldown."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def with_runner(
    config: dict[str, Any],
    tmp: Path,
    body: Any,
    config_path: Path | None = None,
    clock: Clock | None = None,
) -> None:
    app = RunnerApp(SpillwayConfig.model_validate(config), config_path, clock or Clock())
    sock = tmp / "runner.sock"
    server = await serve(Runner(app.plugins), sock)
    peer = ApisixPeer(sock)
    try:
        await body(app, peer)
    finally:
        await peer.close()
        app.close()
        server.close()


def answered_by_function(outcome: Outcome) -> dict[str, Any]:
    assert outcome.stop is not None, outcome
    assert outcome.stop.status == 200, outcome.stop
    assert any(k == "x-spillway-instance" for k, _ in outcome.stop.headers)
    return json.loads(outcome.stop.body)  # type: ignore[no-any-return]


@pytest.mark.parametrize("want", ["aws", "ali"])
def test_invoke_mode_signs_for_real_and_returns_the_functions_answer(
    cloud: CloudFake, tmp_path: Path, want: str
) -> None:
    async def body(app: RunnerApp, peer: ApisixPeer) -> None:
        result = answered_by_function(await peer.request(ROUTE, infer(want)))
        assert result["outputs"][0]["data"] == [11, 22, 33, 44]
        kept = await peer.request(ROUTE, infer(want, "confidential"))
        assert kept.rewrite is not None and dict(kept.rewrite.headers)["x-spillway-target"] == "local"

    asyncio.run(with_runner(config_for(cloud), tmp_path, body))
    assert cloud.valid == 1 and cloud.invalid == [], "only the public request reached the cloud, signed"


def test_breaker_opens_on_failures_and_hangs_then_a_probe_restores_it(
    cloud: CloudFake, tmp_path: Path
) -> None:
    clock = Clock()

    async def body(app: RunnerApp, peer: ApisixPeer) -> None:
        cloud.mode = "broken"
        for _ in range(2):
            failed = await peer.request(ROUTE, infer("aws"))
            assert failed.rewrite is not None and dict(failed.rewrite.headers)["x-spillway-target"] == "local"
        calls = cloud.calls
        for _ in range(3):
            fallback = await peer.request(ROUTE, infer("aws"))
            assert (
                fallback.rewrite is not None
                and dict(fallback.rewrite.headers)["x-spillway-target"] == "local"
            )
        assert cloud.calls == calls, "an open breaker must not send traffic"
        assert app.state.breakers["aws"].state == "open"
        clock.advance(0.6)
        cloud.mode = "hanging"
        hung = await peer.request(ROUTE, infer("aws"))
        assert hung.rewrite is not None, "a hanging target times out and falls back"
        assert app.state.breakers["aws"].state == "open", "a failed probe reopens"
        clock.advance(1.1)
        cloud.mode = "healthy"
        answered_by_function(await peer.request(ROUTE, infer("aws")))
        assert app.state.breakers["aws"].state == "closed"
        answered_by_function(await peer.request(ROUTE, infer("aws")))

    asyncio.run(with_runner(config_for(cloud), tmp_path, body, clock=clock))


def test_metrics_unreachable_keeps_everything_local(cloud: CloudFake, tmp_path: Path) -> None:
    config = config_for(
        cloud,
        local={
            "endpoints": [{"url": "http://127.0.0.1:9", "metrics_url": "http://127.0.0.1:9/metrics"}],
            "scrape_period_s": 0.05,
        },
    )
    config["rules"] = []

    async def body(app: RunnerApp, peer: ApisixPeer) -> None:
        app.start()
        async with asyncio.timeout(30):
            # Polls the counter the failing scrapes increment (there is no event to wait on).
            while app.state.metrics.scrape_errors._value.get() == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        outcome = await peer.request(ROUTE, infer("none"))
        assert outcome.rewrite is not None and dict(outcome.rewrite.headers)["x-spillway-target"] == "local"
        assert ("x-spillway-decision", "local;signals_missing") in outcome.rewrite.resp_headers
        app.state.refresh_gauges()
        assert app.state.metrics.signals_fresh._value.get() == 0

    asyncio.run(with_runner(config, tmp_path, body))


def test_a_route_can_leave_the_decision_header_out(cloud: CloudFake, tmp_path: Path) -> None:
    config = config_for(
        cloud,
        local={"endpoints": [{"url": "http://127.0.0.1:9", "metrics_url": "http://127.0.0.1:9/metrics"}]},
    )
    config["rules"] = []
    quiet = RouteConf("route#quiet", [("spillway", json.dumps({"decision_header": False}))])

    async def body(app: RunnerApp, peer: ApisixPeer) -> None:
        app.start()
        outcome = await peer.request(quiet, infer("none"))
        assert outcome.rewrite is not None and dict(outcome.rewrite.headers)["x-spillway-target"] == "local"
        assert "x-spillway-decision" not in dict(outcome.rewrite.resp_headers)
        shown = await peer.request(ROUTE, infer("none"))
        assert shown.rewrite is not None and "x-spillway-decision" in dict(shown.rewrite.resp_headers)

    asyncio.run(with_runner(config, tmp_path, body))


def test_invalid_reload_keeps_the_old_config_serving(cloud: CloudFake, tmp_path: Path) -> None:
    path = tmp_path / "spillway.yaml"
    config = config_for(cloud)
    path.write_text(yaml.safe_dump(config))

    async def body(app: RunnerApp, peer: ApisixPeer) -> None:
        path.write_text("targets: [{name: BAD NAME, kind: nope}]\n")
        assert app.reload() is False
        answered_by_function(await peer.request(ROUTE, infer("aws")))
        config["rules"] = []
        path.write_text(yaml.safe_dump(config))
        assert app.reload() is True
        outcome = await peer.request(ROUTE, infer("aws"))
        assert outcome.rewrite is not None, "without the rule, a calm cluster keeps it local"

    asyncio.run(with_runner(config, tmp_path, body, path))


def test_budget_exhausted_and_tenant_over_quota(cloud: CloudFake, tmp_path: Path) -> None:
    config = config_for(
        cloud,
        budgets={"per_target_hourly_usd": {"aws": 0.015}},
        tenants={"quotas": {"t1": {"requests_per_minute": 2}}},
    )
    config["targets"][0]["cost"] = {"usd_per_request": 0.01, "usd_per_gb_second": 0, "billed_init": False}
    cost = {}

    async def body(app: RunnerApp, peer: ApisixPeer) -> None:
        answered_by_function(await peer.request(ROUTE, infer("aws")))
        cost["spent"] = app.state.ledger.spent("target:aws", time.time())[0]
        over = await peer.request(ROUTE, infer("aws"))
        assert over.rewrite is not None and dict(over.rewrite.headers)["x-spillway-target"] == "local"
        tenant = PeerRequest("GET", "/v2/models/add_sub", headers=[("x-tenant", "t1")])
        first, second, third = [await peer.request(ROUTE, tenant) for _ in range(3)]
        assert first.rewrite is not None and second.rewrite is not None
        assert third.stop is not None and third.stop.status == 429
        assert ("retry-after", "60") in third.stop.headers

    asyncio.run(with_runner(config, tmp_path, body))
    assert cost["spent"] == pytest.approx(0.01)
