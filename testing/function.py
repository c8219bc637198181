"""The cloud function as real processes: ``python -m functions serve`` as FC runs it, the Lambda
handler under the official emulator, a local pool of instances; and the requests they are sent."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from functions.cli import serve_command
from functions.process_tree import alive, descendants
from functions.sidecar import free_port
from testing.http import answers, http, wait_until
from testing.paths import EVENTS, EXAMPLE_MODELS, ROOT, TEST_MODELS, tool

ADD_SUB_BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]},
        ]
    }
).encode()


def load_event(name: str) -> dict[str, Any]:
    """One captured event shape from ``tests/events``."""
    return json.loads((EVENTS / name).read_text())  # type: ignore[no-any-return]


AWSLAMBDARIC = ("-m", "awslambdaric", "functions.aws_lambda.handler")
# The runtime that streams (a Function URL in RESPONSE_STREAM mode): functions.lambda_stream.
STREAMING_RUNTIME = ("-m", "functions", "lambda-runtime")


def model_repository(tmp: Path, *models: str) -> Path:
    """A repository holding the named example and test models (copied, so each test owns its own)."""
    repo = tmp / "models"
    repo.mkdir(exist_ok=True)
    for name in models:
        source = EXAMPLE_MODELS / name if (EXAMPLE_MODELS / name).exists() else TEST_MODELS / name
        shutil.copytree(source, repo / name)
    return repo


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
    """Stops the server and what it started. The emulator kills its runtime outright, whose
    tritonserver follows it (its parent-death signal), but Triton's backend stubs are Triton's
    children and would stay behind, orphaned: whatever of the tree is still running is killed."""
    tree = descendants(proc.pid)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in tree:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


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
                    if answers(running.url + "/v2/health/live")
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
def lambda_emulator(
    repo: Path, tmp: Path, timeout_s: int = 30, runtime: tuple[str, ...] = AWSLAMBDARIC, **env: str
) -> Iterator[Running]:
    """The real ``awslambdaric`` handler (or another ``runtime`` command) under the official
    ``aws-lambda-rie``."""
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
                *runtime,
            ],
            env=full_env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    running = Running(proc, f"http://127.0.0.1:{port}/2015-03-31/functions/function/invocations", log)
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/") or proc.poll() is not None, 30, "emulator up")
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
