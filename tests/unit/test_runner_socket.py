"""The runner over a real Unix socket, driven by the APISIX-side peer and by raw bytes."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from devtools.apisix_peer import PeerRequest, RouteConf
from gateway_plugin.protocol import encode, messages
from gateway_plugin.protocol.frames import ErrCode, FrameType, frame
from gateway_plugin.runner import Runner, serve
from gateway_plugin.runner.conf_cache import ConfCache
from testing.http import wait_until
from testing.paths import ROOT
from testing.runner import running_runner

REQUEST = PeerRequest(
    "POST",
    "/v2/models/add_sub/infer",
    [("q", "1")],
    [("X-A", "b"), ("content-type", "x")],
    "192.0.2.7",
    {"route_id": "route-ü".encode()},
    b"body \xc3\xa9\x00\xff",
)


def route(*plugins: tuple[str, object], allow_degradation: bool = False) -> RouteConf:
    conf = [(name, json.dumps(value)) for name, value in plugins]
    return RouteConf("route#" + json.dumps(conf), conf, allow_degradation)


def test_prepare_then_rewrite_sends_only_what_the_plugins_asked_for() -> None:
    async def go() -> None:
        async with running_runner() as (_, peer, _):
            conf = {
                "set": {"x-spillway-target": "aws"},
                "delete": ["content-type"],
                "response": {"x-decision": "aws;overflow"},
            }
            outcome = await peer.request(route(("headers", conf)), REQUEST)
            rewrite = outcome.rewrite
            assert rewrite is not None and outcome.status is None
            assert rewrite.headers == [("x-spillway-target", "aws"), ("content-type", None)]
            assert rewrite.resp_headers == [("x-decision", "aws;overflow")]
            assert rewrite.path is None and rewrite.body is None and rewrite.args == []
            nothing = await peer.request(route(("headers", {})), REQUEST)
            assert nothing.rewrite is None and nothing.stop is None and nothing.status is None

    asyncio.run(go())


def test_stop_ends_the_chain_and_sees_the_request() -> None:
    async def go() -> None:
        async with running_runner() as (_, peer, _):
            outcome = await peer.request(route(("stop", {"status": 451}), ("failing", {})), REQUEST)
            assert outcome.stop == messages.Stop(
                451, [("x-stopped", "yes")], b"POST /v2/models/add_sub/infer 1 b 192.0.2.7"
            )

    asyncio.run(go())


def test_extra_info_var_and_body_round_trip_non_ascii_bytes() -> None:
    async def go() -> None:
        async with running_runner() as (_, peer, _):
            outcome = await peer.request(route(("echo-extra", {})), REQUEST)
            assert outcome.stop is not None
            assert outcome.stop.body == "route-ü".encode() + b"|None|" + REQUEST.body
            prefetched = await peer.request(route(("prefetch", {})), REQUEST)
            assert prefetched.rewrite is not None
            assert dict(prefetched.rewrite.headers) == {
                "x-route": "route-ü",
                "x-body-length": str(len(REQUEST.body)),
            }

    asyncio.run(go())


def test_expired_token_is_refreshed_as_apisix_does() -> None:
    now = [0.0]
    confs = ConfCache(ttl_s=10, clock=lambda: now[0])

    async def go() -> None:
        async with running_runner(confs) as (_, peer, _):
            r = route(("stop", {}))
            assert (await peer.request(r, REQUEST)).stop is not None
            assert peer.prepares == 1
            now[0] = 11
            outcome = await peer.request(r, REQUEST)
            assert outcome.stop is not None and peer.prepares == 2

    asyncio.run(go())


def test_response_call_can_rewrite_the_answer() -> None:
    async def go() -> None:
        async with running_runner() as (_, peer, _):
            answer = await peer.response(
                route(("response", {})), 200, [("content-type", "text/plain")], b"ok"
            )
            assert answer == messages.RespCallAnswer(
                answer.id if answer else 0, 201, [("x-upstream-type", "text/plain")], b"OK"
            )

    asyncio.run(go())


@pytest.mark.parametrize(
    "plugins", [[("failing", {})], [("no-such-plugin", {})], [("stop", {"status": "x"})]]
)
def test_failures_answer_503_not_a_pass_through(plugins: list[tuple[str, object]]) -> None:
    async def go() -> None:
        async with running_runner() as (_, peer, _):
            outcome = await peer.request(route(*plugins), REQUEST)
            assert outcome.status == 503 and outcome.rewrite is None
            degraded = await peer.request(route(*plugins, allow_degradation=True), REQUEST)
            assert degraded.status is None and degraded.rewrite is None and degraded.error

    asyncio.run(go())


def test_a_hundred_concurrent_connections() -> None:
    async def go() -> None:
        async with running_runner() as (_, peer, _):
            r = route(("echo-extra", {}))

            async def one(i: int) -> bytes:
                request = PeerRequest(
                    "GET", f"/{i}", vars={"route_id": str(i).encode()}, body=str(i).encode()
                )
                outcome = await peer.request(r, request)
                assert outcome.stop is not None
                return outcome.stop.body

            bodies = await asyncio.gather(*(one(i) for i in range(100)))
            assert bodies == [f"{i}|None|{i}".encode() for i in range(100)]

    asyncio.run(go())


def raw_exchange(sock_path: Path, data: bytes, shutdown: bool = False) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock_path))
        s.sendall(data)
        if shutdown:
            s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
                if len(out) >= 4 and len(out) >= 4 + int.from_bytes(out[1:4], "big"):
                    break
        except TimeoutError:
            pass
        return out


ERR = {code: frame(FrameType.RPC_ERROR, encode.error(code)) for code in ErrCode}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (frame(FrameType.HTTP_REQ_CALL, b"\xde\xad\xbe\xef garbage bytes"), ERR[ErrCode.BAD_REQUEST]),
        (frame(9, b"unknown type"), ERR[ErrCode.BAD_REQUEST]),
        (frame(FrameType.PREPARE_CONF, b"\x01\x02"), ERR[ErrCode.BAD_REQUEST]),
        (
            frame(FrameType.HTTP_REQ_CALL, encode.req_call(1, 999, 0, "/", [], [], bytes(4))),
            ERR[ErrCode.CONF_TOKEN_NOT_FOUND],
        ),
        (frame(FrameType.EXTRA_INFO, encode.extra_info_answer(b"unasked")), ERR[ErrCode.BAD_REQUEST]),
    ],
)
def test_bad_frames_get_the_right_error_frame(data: bytes, expected: bytes) -> None:
    async def go() -> None:
        async with running_runner() as (_, peer, sock):
            answer = await asyncio.to_thread(raw_exchange, sock, data)
            assert answer == expected
            assert (await peer.request(route(("stop", {})), REQUEST)).stop is not None

    asyncio.run(go())


@pytest.mark.parametrize("data", [b"\x02\x00\x01", b"\x02\x00\x10\x00" + b"x" * 100, os.urandom(64)])
def test_truncated_frames_and_early_close_leave_others_served(data: bytes) -> None:
    async def go() -> None:
        async with running_runner() as (_, peer, sock):
            await asyncio.to_thread(raw_exchange, sock, data, True)
            assert (await peer.request(route(("stop", {})), REQUEST)).stop is not None

    asyncio.run(go())


def test_run_command_serves_the_socket_apisix_names_and_cleans_up() -> None:
    sock = Path(tempfile.mkdtemp(prefix="spillway-run-")) / "runner.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway_plugin", "run"],
        cwd=ROOT,
        env={**os.environ, "APISIX_LISTEN_ADDRESS": f"unix:{sock}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(sock.exists, 30, "runner socket")
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600, "only the runner's user may talk to the runner"
        conf = encode.prepare_conf("k", [("headers", '{"set": {"x-a": "1"}}')])
        answer = raw_exchange(sock, frame(FrameType.PREPARE_CONF, conf))
        assert answer[0] == FrameType.PREPARE_CONF and messages.conf_token(answer[4:]) > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert not sock.exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_stop_in_the_middle_of_a_metrics_scrape_leaves_nothing_half_done(tmp_path: Path) -> None:
    """SIGTERM while a scrape waits on a slow Triton: the background tasks are cancelled and waited
    for, so asyncio has nothing unretrieved or pending to complain about."""
    scraping = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            scraping.set()
            time.sleep(3)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    triton = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=triton.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{triton.server_port}"
    config = tmp_path / "spillway.yaml"
    config.write_text(
        json.dumps(
            {
                "local": {
                    "endpoints": [{"url": url, "metrics_url": url + "/metrics"}],
                    "scrape_period_s": 0.1,
                },
                "metrics": {"listen": None},
                "outcomes": {"listen": None},
            }
        )
    )
    sock = tmp_path / "runner.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway_plugin", "run", "--config", str(config)],
        cwd=ROOT,
        env={**os.environ, "APISIX_LISTEN_ADDRESS": f"unix:{sock}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(sock.exists, 30, "runner socket")
        assert scraping.wait(10), "the runner scrapes"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
        triton.shutdown()
    assert proc.returncode == 0, output
    for complaint in (b"never retrieved", b"Task was destroyed", b"Traceback"):
        assert complaint not in output, output.decode(errors="replace")


def test_a_socket_group_opens_the_socket_to_that_group_only(tmp_path: Path) -> None:
    sock = tmp_path / "runner.sock"
    group = grp.getgrgid(os.getgid()).gr_name

    async def go() -> int:
        server = await serve(Runner({}), sock, group)
        mode = stat.S_IMODE(sock.stat().st_mode)
        server.close()
        return mode

    assert asyncio.run(go()) == 0o660


def test_a_stopping_runner_never_removes_its_successors_socket(tmp_path: Path) -> None:
    """On ``apisix reload`` the new runner listens on the same path before the old one exits."""
    from gateway_plugin.runner import socket_identity, unlink_if_ours

    sock = tmp_path / "runner.sock"

    async def go() -> bool:
        first = await serve(Runner({}), sock)
        mine = socket_identity(sock)
        successor = await serve(Runner({}), sock)
        unlink_if_ours(sock, mine)
        still_there = sock.is_socket()
        first.close()
        successor.close()
        return still_there

    assert asyncio.run(go())
