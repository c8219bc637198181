"""The development gateway proxies end to end through a real runner process, as APISIX would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from functions.sidecar import free_port
from testing.gateway import devgateway
from testing.http import QuietHandler, http, http_server_thread, wait_until
from testing.paths import ROOT


@contextmanager
def upstream(name: str) -> Iterator[str]:
    """A plain HTTP server that says who it is and what it received."""

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            reply = json.dumps(
                {
                    "upstream": name,
                    "path": self.path,
                    "body": body.decode(),
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                }
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    with http_server_thread(Handler) as url:
        yield url


def test_devgateway_routes_by_the_runners_decision(tmp_path: Path) -> None:
    with upstream("local") as local, upstream("aws") as aws:
        port = free_port()
        config = {
            "devgateway": {
                "listen": f"127.0.0.1:{port}",
                "upstreams": {"local": local, "aws": aws},
                "plugins": [
                    [
                        "headers",
                        {
                            "set": {"x-spillway-target": "aws"},
                            "delete": ["cookie"],
                            "response": {"x-spillway-decision": "aws;test"},
                        },
                    ]
                ],
            }
        }
        path = tmp_path / "spillway.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = subprocess.Popen(
            [sys.executable, "-m", "devtools", "devgateway", "--config", str(path)],
            cwd=ROOT,
            env=os.environ.copy(),
        )
        try:

            def up() -> bool:
                try:
                    http("POST", f"http://127.0.0.1:{port}/x", b"", timeout=1)
                    return True
                except OSError:
                    return proc.poll() is not None

            wait_until(up, 30, "devgateway listening")
            status, headers, body = http(
                "POST",
                f"http://127.0.0.1:{port}/v2/models/m/infer?x=1",
                b"payload",
                {"cookie": "secret", "content-type": "text/plain"},
            )
            seen = json.loads(body)
            assert status == 200 and seen["upstream"] == "aws"
            assert seen["path"] == "/v2/models/m/infer?x=1" and seen["body"] == "payload"
            # The decision picks the upstream and stays at the gateway, as the route's edge does.
            assert "cookie" not in seen["headers"] and "x-spillway-target" not in seen["headers"]
            assert headers["x-spillway-decision"] == "aws;test"
        finally:
            proc.terminate()
            assert proc.wait(15) == 0


def test_check_config_names_the_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"rules": [{"name": "r", "action": "fly"}], "runner": {"conf_ttl_s": -1}}))
    result = subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "check-config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    assert "runner.conf_ttl_s" in result.stderr and "rules.0.action" in result.stderr


def test_a_forged_target_never_reaches_the_cloud_even_with_the_runner_down(tmp_path: Path) -> None:
    """With degradation allowed, APISIX passes requests on unasked: the client's own header is what
    traffic-split sees, and it must not match a cloud rule."""
    with upstream("local") as local, upstream("aws") as aws:
        config = {
            "targets": [{"name": "aws", "kind": "http", "url": aws, "signing_key_env": None}],
            "metrics": {"listen": None},
            "devgateway": {"upstreams": {"local": local, "aws": aws}, "allow_degradation": True},
        }
        with devgateway(config, tmp_path) as (url, proc):
            runner = subprocess.run(
                ["pgrep", "-P", str(proc.pid), "-f", "gateway_plugin run"], capture_output=True, text=True
            ).stdout.split()
            assert len(runner) == 1
            os.kill(int(runner[0]), signal.SIGKILL)
            for forged in ("aws", "aws:" + "0" * 32, "AWS", " aws"):
                status, _, body = http(
                    "POST",
                    url + "/v2/models/m/infer",
                    b"{}",
                    {"x-spillway-target": forged, "x-data-classification": "confidential"},
                )
                assert status == 200 and json.loads(body)["upstream"] == "local", (forged, body)
