"""The on-prem upstream's health on a real Apache APISIX 3.18: with two Tritons behind the route, one
that dies (its process killed: the kernel closes its port and its connections) leaves the rotation
(APISIX retries a refused connection on the other node, and the generated route's active and
passive checks mark it unhealthy), and every request is still answered by the other."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest

from functions.sidecar import free_port
from testing.apisix import gateway_for, needs_apisix
from testing.http import http, wait_until
from testing.standins import StandIns, metrics_feed, upstream

pytestmark = [pytest.mark.integration, needs_apisix()]

# A second on-prem node as a process of its own, so that killing it closes everything it held.
NODE = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def _answer(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps({"upstream": "second"}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_dead_onprem_node_leaves_the_rotation_and_every_request_is_answered(tmp_path: Path) -> None:
    with ExitStack() as stack:
        first = stack.enter_context(upstream("first"))
        aws = stack.enter_context(upstream("aws"))
        feed = stack.enter_context(metrics_feed())
        port = free_port()
        second = subprocess.Popen([sys.executable, "-c", NODE, str(port)])
        stack.callback(second.kill)
        config = StandIns(first, aws, feed).config()
        config["local"]["endpoints"].append({"url": f"http://127.0.0.1:{port}", "metrics_url": feed.url})
        gateway = stack.enter_context(gateway_for(config, tmp_path))
        url = gateway.url + "/v2/models/add_sub/infer"

        def served_by() -> str:
            status, _, body = http("POST", url, b"{}", {"x-data-classification": "public"})
            assert status == 200, (status, body)
            return body.split(b'"upstream": "', 1)[1].split(b'"', 1)[0].decode()

        wait_until(lambda: {served_by() for _ in range(8)} == {"first", "second"}, 30, "both nodes serving")
        second.kill()
        second.wait()
        seen = Counter(served_by() for _ in range(60))
        assert seen == Counter({"first": 60}), seen
        wait_until(lambda: "unhealthy" in gateway.error_log(), 30, "APISIX's checks marking it unhealthy")
