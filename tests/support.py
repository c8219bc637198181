"""Real processes for the integration tests: function servers and the Lambda emulator."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, NamedTuple

from functions.cli import serve_command
from functions.sidecar import free_port
from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets

ROOT = Path(__file__).resolve().parent.parent
EVENTS = Path(__file__).resolve().parent / "events"
EXAMPLE_MODELS = ROOT / "examples" / "model_repository"
TEST_MODELS = Path(__file__).resolve().parent / "model_repository"

ADD_SUB_BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]},
        ]
    }
).encode()


def gateway_state(config: SpillwayConfig, **kwargs: Any) -> GatewayState:
    """The runner's state with the secrets this process's environment holds, as its edge reads them."""
    return GatewayState(config, GatewaySecrets.read(config), **kwargs)


def load_event(name: str) -> dict[str, Any]:
    """One captured event shape from ``tests/events``."""
    return json.loads((EVENTS / name).read_text())  # type: ignore[no-any-return]


def tool(name: str) -> Path:
    """A real third-party binary fetched by ``scripts/fetch-tools.sh``."""
    root = Path(os.environ.get("SPILLWAY_TOOLS", ROOT / ".cache" / "tools"))
    path = root / "bin" / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run 'bash scripts/fetch-tools.sh' first")
    return path


def model_repository(tmp: Path, *models: str) -> Path:
    """A repository holding the named example and test models (copied, so each test owns its own)."""
    repo = tmp / "models"
    repo.mkdir(exist_ok=True)
    for name in models:
        source = EXAMPLE_MODELS / name if (EXAMPLE_MODELS / name).exists() else TEST_MODELS / name
        shutil.copytree(source, repo / name)
    return repo


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll for readiness instead of sleeping a fixed time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise TimeoutError(f"{what} not within {timeout} s")


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _answers(url: str) -> bool:
    try:
        http("GET", url, timeout=1)
        return True
    except OSError:
        return False


class Running:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def triton_pid(self) -> int:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid), "-f", "tritonserver"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if not out:
            raise RuntimeError("no tritonserver child found")
        return int(out[0])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def function_server(
    repo: Path, tmp: Path, platform: str = "aliyun-fc", wait_ready: bool = True, **env: str
) -> Iterator[Running]:
    """``python -m functions serve`` as FC runs it, on a free loopback port."""
    port = free_port()
    log = tmp / f"function-{port}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            serve_command(port, repo, platform),
            env=full_env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    running = Running(proc, f"http://127.0.0.1:{port}", log)
    try:
        if wait_ready:
            key = env.get("SPILLWAY_SIGNING_KEY")

            def probe_headers() -> dict[str, str]:
                if key is None:
                    return {}
                from functions.signature import sign

                return {"x-spillway-signature": sign(key.encode(), "GET", "/v2/health/ready", b"")}

            ready = running.url + "/v2/health/ready"
            wait_until(
                lambda: (
                    http("GET", ready, headers=probe_headers(), timeout=1)[0] == 200
                    if _answers(running.url + "/v2/health/live")
                    else proc.poll() is not None
                ),
                60,
                "function ready",
            )
            if proc.poll() is not None:
                raise RuntimeError(f"function server exited:\n{running.log_text()}")
        yield running
    finally:
        _stop(proc)


@contextmanager
def lambda_emulator(repo: Path, tmp: Path, timeout_s: int = 30, **env: str) -> Iterator[Running]:
    """The real ``awslambdaric`` handler under the official ``aws-lambda-rie``."""
    port, api_port = free_port(), free_port()
    log = tmp / f"rie-{port}.log"
    full_env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "AWS_LAMBDA_FUNCTION_TIMEOUT": str(timeout_s),
        "SPILLWAY_MODEL_REPOSITORY": str(repo),
        **env,
    }
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                str(tool("aws-lambda-rie")),
                "--runtime-interface-emulator-address",
                f"127.0.0.1:{port}",
                "--runtime-api-address",
                f"127.0.0.1:{api_port}",
                sys.executable,
                "-m",
                "awslambdaric",
                "functions.aws_lambda.handler",
            ],
            env=full_env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    running = Running(proc, f"http://127.0.0.1:{port}/2015-03-31/functions/function/invocations", log)
    try:
        wait_until(
            lambda: _answers(f"http://127.0.0.1:{port}/") or proc.poll() is not None, 30, "emulator up"
        )
        yield running
    finally:
        _stop(proc)


def invoke(running: Running, event: object, timeout: float = 60) -> Any:
    """One synchronous invocation through the emulator; returns the decoded payload."""
    status, _, body = http("POST", running.url, json.dumps(event).encode(), timeout=timeout)
    assert status == 200, body
    return json.loads(body)


def http_event(
    method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None, binary: bool = False
) -> dict[str, Any]:
    """A Function-URL-shaped event, built from the captured one."""
    import base64

    event = load_event("function_url.json")
    path, _, query = target.partition("?")
    event["rawPath"], event["rawQueryString"] = path, query
    event["requestContext"]["http"].update(method=method, path=path)
    event["headers"] = {**event["headers"], **(headers or {})}
    if binary:
        event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode(), True
    else:
        event["body"], event["isBase64Encoded"] = body.decode(), False
    return event


@contextmanager
def local_pool(repo: Path, **settings: Any) -> Iterator[tuple[str, Any]]:
    """A ``LocalFunctionPool`` of real FC function instances behind an HTTP front."""
    from devtools.local_pool import PoolSettings, running_pool

    with running_pool(PoolSettings(repo, **settings)) as (url, pool):
        yield url, pool


class QuietHandler(BaseHTTPRequestHandler):
    """``http.server``'s handler without its line on stderr per request."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def http_server_thread(
    handler: type[Any],
    tls: ssl.SSLContext | None = None,
    host: str = "127.0.0.1",
    bind: tuple[str, int] = ("127.0.0.1", 0),
) -> Iterator[str]:
    """A plain ``http.server`` on a loopback port, for upstreams and misbehaving targets; with
    ``tls``, HTTPS (its URL names ``host``); ``bind``: another loopback address and a given port
    (each pod of a headless Service has its own address and the same ports)."""
    import threading
    from http.server import ThreadingHTTPServer

    class Server(ThreadingHTTPServer):
        # A burst of connections at once is queued, not refused or left to time out (the default
        # backlog of 5 makes the gateway's 1 s connect timeout answer 504 for some of them).
        request_queue_size = 128
        daemon_threads = True

    server = Server(bind, handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = host if bind[0] == "127.0.0.1" else bind[0]
        yield f"{'https' if tls else 'http'}://{address}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def devgateway(
    config: dict[str, Any], tmp: Path, **env: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m devtools devgateway`` (it starts its own runner) on a free loopback port."""
    import yaml

    port = free_port()
    config = {**config, "devgateway": {**config.get("devgateway", {}), "listen": f"127.0.0.1:{port}"}}
    path = tmp / f"devgateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "devtools", "devgateway", "--config", str(path)],
        cwd=ROOT,
        env={**os.environ, **env},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url + "/") or proc.poll() is not None, 30, "devgateway listening")
        if proc.poll() is not None:
            raise RuntimeError("the development gateway exited")
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(15)


class CertAuthority(NamedTuple):
    key: Path
    cert: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(tmp: Path, name: str) -> CertAuthority:
    """A throwaway certificate authority (the openssl command line), for loopback TLS."""
    ca = CertAuthority(tmp / f"{name}.key", tmp / f"{name}.pem")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-keyout", str(ca.key), "-out", str(ca.cert),
    )  # fmt: skip
    return ca


def server_context(tmp: Path, name: str, host: str, ca: CertAuthority) -> ssl.SSLContext:
    """A server context with a certificate for ``host`` signed by ``ca``."""
    key, csr, cert, ext = (tmp / f"{name}.{s}" for s in ("key", "csr", "pem", "ext"))
    ext.write_text(f"subjectAltName=DNS:{host}\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host}", "-keyout", str(key), "-out", str(csr)
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context
