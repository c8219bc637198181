"""The runner attacked through what clients control (paths, tenants, headers) and through its socket."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import yaml

import testing.runner
from devtools.apisix_peer import ApisixPeer, PeerRequest, RouteConf
from functions.sidecar import free_port
from gateway_plugin.app import RunnerApp
from gateway_plugin.books.outcomes import auth_header
from gateway_plugin.books.target_header import target_value
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.protocol import encode
from gateway_plugin.protocol.frames import ErrCode, FrameType, frame
from gateway_plugin.runner import ConnectionLimits, Runner, serve
from gateway_plugin.runner.conf_cache import ConfCache, PreparedConf, default_ttl
from testing.http import http, wait_until
from testing.paths import ROOT

SPILL = RouteConf("route#spill", [("spillway", "{}")])


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


@contextmanager
def runner_process(tmp_path: Path, config: dict[str, Any], **env: str) -> Iterator[tuple[Path, int]]:
    """``python -m gateway_plugin run`` as APISIX starts it."""
    sock = tmp_path / "runner.sock"
    path = tmp_path / "spillway.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway_plugin", "run", "--config", str(path)],
        cwd=ROOT,
        env={**os.environ, "APISIX_LISTEN_ADDRESS": f"unix:{sock}", **env},
    )
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, 30, "runner socket")
        assert proc.poll() is None, "the runner exited"
        yield sock, proc.pid
    finally:
        proc.terminate()
        proc.wait(15)


def test_unique_models_and_tenants_leave_memory_and_metrics_bounded(tmp_path: Path) -> None:
    metrics_port, outcomes_port = free_port(), free_port()
    config = {
        "targets": [UPSTREAM_TARGET],
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        "outcomes": {"listen": f"127.0.0.1:{outcomes_port}"},
        "tenants": {"default": {"requests_per_minute": 1_000_000}, "max_tracked": 1000},
    }
    token = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
    aws = target_value("aws", token)

    def report(first: int, count: int) -> None:
        """What the route's http-logger posts: unique instances, tenants and models, as a client chose."""
        batch = [
            {
                "target": aws if i % 2 else "local",
                "upstream_status": "200",
                "upstream_s": "0.01",
                "instance": f"i-{i}",
                "tenant": f"tenant-{i}",
                "uri": f"/v2/models/model-{i}/infer",
            }
            for i in range(first, first + count)
        ]
        headers = {"authorization": auth_header(token), "content-type": "application/json"}
        status, _, body = http(
            "POST", f"http://127.0.0.1:{outcomes_port}/spillway/outcomes", json.dumps(batch).encode(), headers
        )
        assert status == 204, body

    async def calls(sock: Path, first: int, count: int) -> None:
        peer = ApisixPeer(sock, pool_size=16)

        async def one(i: int) -> None:
            request = PeerRequest(
                "POST", f"/v2/models/model-{i}/infer", headers=[("x-tenant", f"tenant-{i}")]
            )
            outcome = await peer.request(SPILL, request)
            assert outcome.status is None, outcome

        for start in range(first, first + count, 16):
            await asyncio.gather(*(one(i) for i in range(start, min(start + 16, first + count))))
            if start % 1000 == 0:
                await asyncio.to_thread(report, start, 1000)
        await peer.close()

    with runner_process(tmp_path, config) as (sock, pid):
        asyncio.run(calls(sock, 0, 2000))
        before = _rss_kib(pid)
        asyncio.run(calls(sock, 2000, 50_000))
        growth_mib = (_rss_kib(pid) - before) / 1024
        status, _, metrics = http("GET", f"http://127.0.0.1:{metrics_port}/metrics")
    print(f"50,000 unique models and tenants: runner RSS +{growth_mib:.1f} MiB, /metrics {len(metrics)} B")
    assert status == 200
    assert growth_mib < 20
    assert len(metrics) < 100_000
    # No model the cluster never reported gets a label; tenants only as many as have cost series
    # (metrics.tenant_series, the first heavy spenders), every other one counted as "other".
    assert b"model-4" not in metrics
    tenants = set(re.findall(rb'tenant="(tenant-\d+)"', metrics))
    assert 0 < len(tenants) <= SpillwayConfig().metrics.tenant_series
    assert b'tenant="other"' in metrics


def _serve_in_process(limits: ConnectionLimits) -> Any:
    @contextmanager
    def running(tmp_path: Path) -> Iterator[Path]:
        sock = tmp_path / "r.sock"
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(serve(Runner(testing.runner.test_plugins(), limits=limits), sock))
        import threading

        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            yield sock
        finally:
            loop.call_soon_threadsafe(server.close)
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0.1), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)

    return running


def _read_all(sock_path: Path, data: bytes, timeout: float = 30) -> bytes:
    """Send ``data``, then everything the runner sends until it closes (a hang fails the test)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(str(sock_path))
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_a_partial_frame_is_not_held_forever(tmp_path: Path) -> None:
    with _serve_in_process(ConnectionLimits(frame_timeout_s=0.2))(tmp_path) as sock:
        partial = (FrameType.HTTP_REQ_CALL << 24 | 1_000_000).to_bytes(4, "big") + b"x" * 1000
        assert _read_all(sock, partial) == b"", "the runner closes the connection"


def _prepare(sock: socket.socket, plugin: str) -> int:
    from gateway_plugin.protocol import messages

    sock.sendall(frame(FrameType.PREPARE_CONF, encode.prepare_conf("k", [(plugin, "{}")])))
    answer = sock.recv(65536)
    return messages.conf_token(answer[4:])


def _call(token: int, call_id: int = 1) -> bytes:
    return frame(
        FrameType.HTTP_REQ_CALL, encode.req_call(call_id, token, 2, "/p", [], [], bytes([127, 0, 0, 1]))
    )


def test_frames_sent_ahead_of_an_answer_are_held_to_a_short_queue(tmp_path: Path) -> None:
    serving = _serve_in_process(ConnectionLimits(max_backlog=8))
    with serving(tmp_path) as sock_path, socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(sock_path))
        token = _prepare(sock, "echo-extra")
        sock.sendall(_call(token))
        question = sock.recv(65536)
        assert question[0] == FrameType.EXTRA_INFO, "the plugin asks APISIX a question"
        flood = b"".join(_call(token, i) for i in range(2, 10_000))
        with suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(flood)
        rest = b""
        with suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                rest += chunk
    assert rest == b"", "the connection is closed, not buffered"


def test_an_unanswered_extra_info_question_fails_the_call_not_the_runner(tmp_path: Path) -> None:
    serving = _serve_in_process(ConnectionLimits(ask_timeout_s=0.2))
    with serving(tmp_path) as sock_path, socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(sock_path))
        token = _prepare(sock, "echo-extra")
        sock.sendall(_call(token))
        assert sock.recv(65536)[0] == FrameType.EXTRA_INFO
        answer = sock.recv(65536)
    assert answer == frame(FrameType.RPC_ERROR, encode.error(ErrCode.SERVICE_UNAVAILABLE))


def test_the_conf_cache_is_capped_and_expires_oldest_first() -> None:
    now = [0.0]
    cache = ConfCache(ttl_s=10, clock=lambda: now[0], max_entries=3)
    conf = PreparedConf(())
    tokens = [cache.put(conf) for _ in range(3)]
    fourth = cache.put(conf)
    assert cache.get(tokens[0]) is None and cache.get(fourth) is conf and len(cache) == 3
    now[0] = 10.5
    assert cache.get(tokens[1]) is None
    now[0] = 11.0
    cache.put(conf)
    assert len(cache) == 1, "every expired token is gone once a new one is handed out"


@pytest.mark.parametrize("value", ["0", "-1", "abc", "inf"])
def test_a_non_positive_conf_expiry_is_refused_with_a_warning(
    value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("APISIX_CONF_EXPIRE_TIME", value)
    with caplog.at_level(logging.WARNING):
        assert default_ttl() == 3600 * 2.0
    assert "APISIX_CONF_EXPIRE_TIME" in caplog.text


UPSTREAM_TARGET = {"name": "aws", "kind": "http", "url": "https://fn.example", "signing_key_env": None}


def test_the_runner_refuses_to_start_without_a_route_token(tmp_path: Path) -> None:
    path = tmp_path / "spillway.yaml"
    path.write_text(yaml.safe_dump({"targets": [UPSTREAM_TARGET], "metrics": {"listen": None}}))
    env = {k: v for k, v in os.environ.items() if k != "SPILLWAY_ROUTE_TOKEN"}
    for token in (None, "short"):
        result = subprocess.run(
            [sys.executable, "-m", "gateway_plugin", "run", "--config", str(path)],
            cwd=ROOT,
            env={**env, "APISIX_LISTEN_ADDRESS": f"unix:{tmp_path}/r.sock"}
            | ({} if token is None else {"SPILLWAY_ROUTE_TOKEN": token}),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2 and "SPILLWAY_ROUTE_TOKEN" in result.stderr, result.stderr


def test_the_route_matches_the_values_the_runner_sets(tmp_path: Path) -> None:
    path = tmp_path / "spillway.yaml"
    endpoint = {"url": "http://127.0.0.1:8000", "metrics_url": "http://127.0.0.1:8002/metrics"}
    path.write_text(yaml.safe_dump({"targets": [UPSTREAM_TARGET], "local": {"endpoints": [endpoint]}}))
    result = subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "apisix-route", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (rule,) = json.loads(result.stdout)["plugins"]["traffic-split"]["rules"]
    value = _mac_value("aws", os.environ["SPILLWAY_ROUTE_TOKEN"].encode())
    assert rule["match"] == [{"vars": [["spillway_upstream", "==", value]]}]
    assert rule["weighted_upstreams"][0]["upstream"]["nodes"] == {"fn.example:443": 1}


def _mac_value(name: str, token: bytes) -> str:
    """A cloud target's ``X-Spillway-Target`` as SECURITY.md defines it, written out here apart
    from the code: ``<name>:`` and the first 32 hex digits of HMAC-SHA256, keyed by the route
    token, of ``spillway-target:<name>``. Tests that took the value from the code itself would
    pass whatever the code computed."""
    digest = hmac.new(token, b"spillway-target:" + name.encode(), hashlib.sha256).hexdigest()
    return f"{name}:{digest[:32]}"


def test_a_target_value_is_the_mac_of_its_name_under_the_route_token() -> None:
    """A known answer, computed apart from the code (openssl dgst -sha256 -hmac gives the same)."""
    token = b"known-answer-route-token-0123456789"
    assert _mac_value("aws", token) == "aws:5c12caeadcc4c74d7830da74e66e0ec7"
    assert target_value("aws", token) == "aws:5c12caeadcc4c74d7830da74e66e0ec7"


def test_another_route_token_or_target_gives_another_value() -> None:
    """Whoever knows one deployment's values, or one target's, must not know another's."""
    token, other = b"known-answer-route-token-0123456789", b"another-route-token-0123456789ab"
    assert target_value("aws", other) == "aws:667e4941286ba9f03975bc7d000e4166"
    assert target_value("aws", other) != target_value("aws", token)
    assert target_value("ali", token).split(":")[1] != target_value("aws", token).split(":")[1]
    assert target_value("ali", token) == _mac_value("ali", token)


@pytest.mark.parametrize(
    ("path", "answer"),
    [
        ("/v2/repository/index", "local"),
        ("/v2/repository/", "local"),
        # The runner gets nginx's $uri, already decoded and resolved: anything else was read
        # another way by whoever chose the route, so it is refused rather than resolved here.
        ("//v2/repository/index", 400),
        ("/v2/./repository/index", 400),
        ("/v2/%72epository/index", 400),
        ("/v2/%2572epository/index", 400),
        ("/v2/models/../repository/index", 400),
    ],
)
def test_rules_see_the_path_as_the_route_matched_it_and_no_other(path: str, answer: str | int) -> None:
    config = SpillwayConfig.model_validate(
        {
            "targets": [UPSTREAM_TARGET],
            "rules": [
                {
                    "name": "admin-stays",
                    "priority": 10,
                    "match": {"uri": "^/v2/repository"},
                    "action": "local",
                },
                {"name": "everything-out", "action": "target", "targets": ["aws"]},
            ],
            "residency": {"unclassified_may_leave": True},
            "metrics": {"listen": None},
        }
    )

    async def decide(target: str) -> str | int:
        app = RunnerApp(config)
        sock = Path(os.environ.get("TMPDIR", "/tmp")) / f"spillway-rules-{os.getpid()}.sock"
        server = await serve(Runner(app.plugins), sock)
        peer = ApisixPeer(sock)
        try:
            outcome = await peer.request(SPILL, PeerRequest("POST", target))
            if outcome.stop is not None:
                return outcome.stop.status
            assert outcome.rewrite is not None, outcome
            return dict(outcome.rewrite.headers)["x-spillway-target"]
        finally:
            await peer.close()
            server.close()
            app.close()

    assert str(asyncio.run(decide("/v2/models/m/infer"))).startswith("aws:")
    assert asyncio.run(decide(path)) == answer


def _check_config(tmp_path: Path, config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "spillway.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "check-config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_config_never_prints_credentials(tmp_path: Path) -> None:
    target = {**UPSTREAM_TARGET, "url": "https://deploy:pa55word@fn.example/"}
    endpoint = {
        "url": "http://triton:8000",
        "metrics_url": "http://admin:s3cret@triton:8002/metrics?k=key9&t",
    }
    result = _check_config(tmp_path, {"targets": [target], "local": {"endpoints": [endpoint]}})
    assert result.returncode == 0, result.stderr
    for secret in ("deploy", "pa55word", "s3cret", "key9"):
        assert secret not in result.stdout
    assert "https://***@fn.example/" in result.stdout
    assert "http://***@triton:8002/metrics?k=***&***" in result.stdout


BROKEN_YAML = {
    "an unknown escape in a quoted URL": (
        'targets:\n  - {name: t, kind: http, url: "https://deploy:pa55word@fn.example/\\q?token=t0ken"}\n',
        "line 2, column",
        "unknown escape character",
    ),
    "a URL indented wrongly": (
        "targets:\n  - name: t\n   url: https://deploy:pa55word@fn.example/?token=t0ken\n",
        "line 3, column 4",
        "expected <block end>",
    ),
    "a tab before a URL": (
        "shared_state:\n\tredis_url: redis://:pa55word@redis:6379/0?token=t0ken\n",
        "line 2, column 1",
        "that cannot start any token",
    ),
    "a tag holding a URL": (
        "local:\n  endpoints: !<https://deploy:pa55word@h/?token=t0ken> []\n",
        "line 2, column 14",
        "could not determine a constructor",
    ),
    "a value YAML cannot convert": ("local:\n  latency_target_ms: !!int pa55word\n", "YAML cannot read", ""),
}


@pytest.mark.parametrize("command", ["check-config", "warmup run", "warmup plan"])
@pytest.mark.parametrize("broken", BROKEN_YAML)
def test_a_yaml_error_names_the_place_and_the_problem_never_the_text_there(
    tmp_path: Path, broken: str, command: str
) -> None:
    text, where, problem = BROKEN_YAML[broken]
    path = tmp_path / "spillway.yaml"
    path.write_text(text)
    args = (
        ["gateway_plugin", "check-config", str(path)]
        if command == "check-config"
        else ["warmup", command.split()[1], "--config", str(path)]
    )
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert str(path) in result.stderr and where in result.stderr and problem in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    for secret in ("deploy", "pa55word", "t0ken"):
        assert secret not in result.stdout + result.stderr, result.stderr


def test_a_config_that_is_not_utf8_is_refused_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "spillway.yaml"
    path.write_bytes(b"targets: []\nlocal: \xff\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "check-config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "not UTF-8 text (byte 20)" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ({"budgets": {"per_target_hourly_usd": {"aws": -5}}}, "budgets.per_target_hourly_usd.aws"),
        ({"budgets": {"per_target_daily_usd": {"aws": ".nan"}}}, "budgets.per_target_daily_usd.aws"),
        ({"local": {"model_latency_targets_ms": {"m": 0}}}, "local.model_latency_targets_ms.m"),
        ({"tenants": {"max_tracked": 0}}, "tenants.max_tracked"),
    ],
)
def test_nonsense_values_are_refused_with_their_path(
    tmp_path: Path, section: dict[str, Any], where: str
) -> None:
    result = _check_config(tmp_path, {"targets": [UPSTREAM_TARGET], **section})
    assert result.returncode == 2 and where in result.stderr, result.stderr


def test_a_blank_signing_key_stops_the_runner(tmp_path: Path) -> None:
    path = tmp_path / "spillway.yaml"
    target = {**UPSTREAM_TARGET, "signing_key_env": "SPILLWAY_SIGNING_KEY"}
    path.write_text(yaml.safe_dump({"targets": [target], "metrics": {"listen": None}}))
    result = subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "run", "--config", str(path)],
        cwd=ROOT,
        env={**os.environ, "APISIX_LISTEN_ADDRESS": f"unix:{tmp_path}/r.sock", "SPILLWAY_SIGNING_KEY": "  "},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "blank signing key" in result.stderr, result.stderr


def test_a_route_prepared_again_keeps_its_token_for_as_long_as_apisix_may_use_it() -> None:
    """APISIX may use a token 1.9 x its expiry time after it was handed out (shared dict, then each
    worker's LRU); the same key and entries get the same token back, renewed."""
    now = [0.0]
    cache = ConfCache(ttl_s=2.0 * 3600, clock=lambda: now[0])
    key = ("route#1", (("spillway", "{}"),))
    token = cache.put(PreparedConf(()), key)
    now[0] = 1.9 * 3600
    assert cache.get(token) is not None, "still usable by a worker's LRU"
    assert cache.renew(key) == token
    assert cache.renew(("route#1", (("spillway", '{"on_prem_only": true}'),))) is None, "other entries"
    now[0] = 1.9 * 3600 + 2.0 * 3600 - 1
    assert cache.get(token) is not None, "renewed"
