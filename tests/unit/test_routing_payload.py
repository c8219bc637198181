"""Payload-aware routing through the real runner: APISIX's call carries the client's
Content-Length, and a body bigger than the target takes never leaves."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from devtools.apisix_peer import ApisixPeer, PeerRequest, RouteConf
from gateway_plugin.app import RunnerApp
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.runner import Runner, serve

ROUTE = RouteConf("route#spillway", [("spillway", "{}")])
CONFIG = SpillwayConfig.model_validate(
    {
        "targets": [
            {
                "name": "aws",
                "kind": "http",
                "url": "http://127.0.0.1:9",
                "signing_key_env": None,
                "max_request_bytes": 1000,
            }
        ],
        "rules": [{"name": "out", "match": {"headers": {"x-want": "aws"}}, "action": "target"}],
        "metrics": {"listen": None},
    }
)


def _call(headers: list[tuple[str, str]]) -> PeerRequest:
    base = [("x-data-classification", "public"), ("x-want", "aws")]
    return PeerRequest("POST", "/v2/models/add_sub/infer", headers=base + headers)


async def _targets(tmp: Path, calls: list[PeerRequest]) -> list[str]:
    app = RunnerApp(CONFIG, None)
    server = await serve(Runner(app.plugins), tmp / "runner.sock")
    peer = ApisixPeer(tmp / "runner.sock")
    found = []
    try:
        for call in calls:
            outcome = await peer.request(ROUTE, call)
            assert outcome.rewrite is not None, outcome
            found.append(dict(outcome.rewrite.headers)["x-spillway-target"].split(":")[0])
    finally:
        await peer.close()
        app.close()
        server.close()
    return found


def test_a_body_over_the_targets_limit_stays_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", "a-route-token-for-the-payload-tests-0123456789")
    calls = [
        _call([("content-length", "1000")]),
        _call([("content-length", "1001")]),
        _call([("transfer-encoding", "chunked")]),
        _call([]),
    ]
    assert asyncio.run(_targets(tmp_path, calls)) == ["aws", "local", "local", "aws"]
