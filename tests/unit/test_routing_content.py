"""Content checks in the runner, through its real socket: which routes and rules read a request's
text, that only a request about to leave is read (the body is asked of APISIX then and only then),
and that what a detector finds keeps it home and is counted by detector, never by text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from devtools.apisix_peer import ApisixPeer, PeerRequest, RouteConf
from gateway_plugin.app import RunnerApp
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.runner import Runner, serve

CHECKED = RouteConf("route#checked", [("spillway", json.dumps({"content_checks": True}))])
PLAIN = RouteConf("route#plain", [("spillway", "{}")])
CONFIG = SpillwayConfig.model_validate(
    {
        "targets": [{"name": "aws", "kind": "http", "url": "http://127.0.0.1:9", "signing_key_env": None}],
        "rules": [
            {
                "name": "read",
                "match": {"headers": {"x-want": "read"}},
                "action": "target",
                "content_checks": True,
            },
            {"name": "out", "match": {"headers": {"x-want": "aws"}}, "action": "target"},
        ],
        "content": {"max_scan_bytes": 1024, "patterns": {"employee_id": "EMP-[0-9]{6}"}},
        "metrics": {"listen": None},
    }
)
CARD = "4111 1111 1111 1111"


def _json(*texts: str) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": list(texts)}]}
    ).encode()


def _call(body: bytes, want: str = "aws", label: str = "public", **headers: str) -> PeerRequest:
    """A request of ``body`` (framed by its Content-Length unless ``headers`` give one, an empty one
    dropping it)."""
    sent = {"x-data-classification": label, "x-want": want, "content-length": str(len(body)), **headers}
    framing = [(k, v) for k, v in sent.items() if v]
    return PeerRequest("POST", "/v2/models/add_sub/infer", headers=framing, body=body)


async def _through(
    tmp: Path, calls: list[tuple[RouteConf, PeerRequest]]
) -> tuple[list[tuple[str, int]], Any]:
    """Each call's decision and how many times the runner asked APISIX for something (the body)."""
    app = RunnerApp(CONFIG, None)
    server = await serve(Runner(app.plugins), tmp / "runner.sock")
    peer = ApisixPeer(tmp / "runner.sock")
    found = []
    try:
        for route, call in calls:
            asked = peer.extra_info_asked
            outcome = await peer.request(route, call)
            assert outcome.rewrite is not None, outcome
            decision = dict(outcome.rewrite.resp_headers)["x-spillway-decision"]
            found.append((decision, peer.extra_info_asked - asked))
    finally:
        await peer.close()
        app.close()
        server.close()
    return found, app.state.metrics.registry


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", "a-route-token-for-the-content-tests-0123456789")


def test_a_matching_text_keeps_a_public_request_home_and_only_what_would_leave_is_read(
    tmp_path: Path,
) -> None:
    calls = [
        (CHECKED, _call(_json("pay with " + CARD))),
        (CHECKED, _call(_json("nothing to see"))),
        (CHECKED, _call(_json("badge EMP-004211"))),
        # Staying home anyway (its label, or no rule sends it out): its text is not read.
        (CHECKED, _call(_json(CARD), label="confidential")),
        (CHECKED, _call(_json(CARD), want="none")),
        # Over the bound, or of unknown size: not read, and home by default.
        (CHECKED, _call(_json("x" * 2000))),
        (CHECKED, _call(_json(CARD), **{"content-length": "", "transfer-encoding": "chunked"})),
        (CHECKED, _call(b"\x1f\x8b compressed", **{"content-encoding": "gzip"})),
        # A route that does not ask pays nothing, unless the deciding rule asks.
        (PLAIN, _call(_json(CARD))),
        (PLAIN, _call(_json(CARD), want="read")),
        (PLAIN, _call(_json("clean"), want="read")),
    ]
    found, registry = asyncio.run(_through(tmp_path, calls))
    assert found == [
        ("local;residency", 1),
        ("aws;overflow_cold", 1),
        ("local;residency", 1),
        ("local;residency", 0),
        ("local;signals_missing", 0),
        ("local;residency", 0),
        ("local;residency", 0),
        ("local;residency", 1),
        ("aws;overflow_cold", 0),
        ("local;residency", 1),
        ("aws;overflow_cold", 1),
    ]
    matches = {
        d: registry.get_sample_value("spillway_content_matches_total", {"detector": d})
        for d in ("card", "employee_id")
    }
    assert matches == {"card": 2.0, "employee_id": 1.0}
    for reason, count in (("too_large", 1.0), ("unknown_size", 1.0), ("not_json", 1.0)):
        assert registry.get_sample_value("spillway_content_unscannable_total", {"reason": reason}) == count


def test_the_residency_log_names_the_detector_never_the_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="spillway.residency")
    found, _ = asyncio.run(_through(tmp_path, [(CHECKED, _call(_json("pay with " + CARD)))]))
    assert found == [("local;residency", 1)]
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "spillway.residency"]
    assert line["content"] == "card" and line["classification"] == "public", line
    assert "4111" not in caplog.text


def test_a_body_with_a_key_twice_is_refused_and_bytes_past_its_tensors_counted(tmp_path: Path) -> None:
    """A body read with a key written twice is answered 400 naming it, and nothing is decided or
    counted for it; a binary body longer than its inputs declare is unscannable, and stays."""

    async def run() -> tuple[Any, str, Any]:
        app = RunnerApp(CONFIG, None)
        server = await serve(Runner(app.plugins), tmp_path / "runner.sock")
        peer = ApisixPeer(tmp_path / "runner.sock")
        try:
            twice = b'{"inputs": [{"datatype": "BYTES", "data": ["' + CARD.encode() + b'"]}], "inputs": []}'
            refused = await peer.request(CHECKED, _call(twice))
            header = b'{"inputs": []}'
            past = _call(header + CARD.encode(), **{"inference-header-content-length": str(len(header))})
            kept = await peer.request(CHECKED, past)
            assert kept.rewrite is not None, kept
            return (
                refused.stop,
                dict(kept.rewrite.resp_headers)["x-spillway-decision"],
                app.state.metrics.registry,
            )
        finally:
            await peer.close()
            app.close()
            server.close()

    stop, decision, registry = asyncio.run(run())
    assert stop is not None and stop.status == 400, stop
    assert json.loads(stop.body)["error"].startswith('duplicate key "inputs" in the JSON body'), stop.body
    assert decision == "local;residency"
    assert (
        registry.get_sample_value("spillway_content_unscannable_total", {"reason": "trailing_bytes"}) == 1.0
    )
    assert (
        registry.get_sample_value("spillway_decisions_total", {"target": "local", "reason": "residency"})
        == 1.0
    )
