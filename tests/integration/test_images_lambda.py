"""The Lambda image, built from images/aws-lambda/Dockerfile on bookworm bases made from Debian's
packages, and run as Lambda runs it: its own ENTRYPOINT and CMD under the official runtime
interface emulator added at run time (as AWS documents for images without it), as its non-root
user, on a read-only root with no /dev/shm, with the environment the Terraform module sets and the
signing key read from a Secrets Manager stand-in."""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from functions.contract import warmup_payload
from functions.sidecar import free_port
from functions.signature import sign
from testing.function import ADD_SUB_BODY, http_event
from testing.http import http, wait_until
from testing.images import (
    Built,
    build,
    built_image,
    container,
    exec_in,
    logs,
    missing_reason,
    running,
    terraform_environment,
)
from testing.paths import tool
from testing.secrets_manager import Secret, secrets_manager

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(missing_reason()), reason=str(missing_reason())),
]

ROOT = Path(__file__).resolve().parents[2]
KEY = "image-test-signing-key-" + os.urandom(8).hex()
LAMBDA_LIMIT_BYTES = 10 * 10**9


@pytest.fixture(scope="module")
def image() -> Iterator[Built]:
    with built_image("lambda", f"localhost/spillway-test-aws-lambda:{os.getpid()}") as built:
        yield built


@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secret]:
    with secrets_manager(tmp_path_factory.mktemp("moto"), "spillway/signing-key", KEY) as held:
        yield held


@dataclass(frozen=True)
class Emulated:
    url: str
    name: str


def lambda_options(image: Built, port: int, api_port: int, env: dict[str, str]) -> list[str]:
    """podman run as Lambda runs the image: the emulator in front of the image's own ENTRYPOINT."""
    config = image.config()
    entrypoint = [
        "/rie/aws-lambda-rie",
        "--runtime-interface-emulator-address",
        f"127.0.0.1:{port}",
        "--runtime-api-address",
        f"127.0.0.1:{api_port}",
        *config["Entrypoint"],
    ]
    options = [
        "--network=host",  # the emulator and the stand-in listen on loopback only
        "--read-only",  # Lambda's root is read-only; podman mounts a fresh /tmp
        "--ipc=none",  # and Lambda mounts no /dev/shm
        f"--user={config['User']}",
        f"--volume={tool('aws-lambda-rie')}:/rie/aws-lambda-rie:ro",
        f"--entrypoint={json.dumps(entrypoint)}",
    ]
    return options + [f"--env={name}={value}" for name, value in env.items()]


@pytest.fixture(scope="module")
def lam(image: Built, secret: Secret) -> Iterator[Emulated]:
    env = {
        **terraform_environment("aws_function", signing_key_secret_arn=secret.arn),
        **secret.function_env(),
        "AWS_LAMBDA_FUNCTION_TIMEOUT": "30",
    }
    port, api_port = free_port(), free_port()
    name = f"spillway-test-lambda-{os.getpid()}"
    cmd = image.config()["Cmd"]
    with container(image.tag, name, lambda_options(image, port, api_port, env), cmd):
        url = f"http://127.0.0.1:{port}/2015-03-31/functions/function/invocations"

        def up() -> bool:
            if not running(name):
                raise RuntimeError(f"the container stopped:\n{logs(name)[-4000:]}")
            try:
                http("GET", f"http://127.0.0.1:{port}/", timeout=1)
                return True
            except OSError:
                return False

        wait_until(up, 60, "the emulator in the container")
        yield Emulated(url, name)


def invoke(lam: Emulated, event: object) -> Any:
    status, _, body = http("POST", lam.url, json.dumps(event).encode(), timeout=60)
    assert status == 200, body
    return json.loads(body)


def signed(
    method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None, binary: bool = False
) -> dict[str, Any]:
    signature = sign(KEY.encode(), method, target, body)
    return http_event(method, target, body, {"x-spillway-signature": signature, **(headers or {})}, binary)


def test_image_runs_as_its_own_user_with_the_documented_entrypoint(image: Built) -> None:
    config = image.config()
    assert config["Entrypoint"] == ["python", "-m", "awslambdaric"]
    assert config["Cmd"] == ["functions.aws_lambda.handler"]
    assert config["User"] == "10001:10001"


def test_size_is_printed_checked_and_documented(image: Built) -> None:
    size = image.size()
    printed = re.search(
        r": ([\d,]+) bytes \([\d.]+ GB\) uncompressed, built in \d+ s; limit 10 GB", image.output
    )
    assert printed, image.output[-2000:]
    assert abs(int(printed.group(1).replace(",", "")) - size) < size / 100, "the script counts as podman does"
    assert size < LAMBDA_LIMIT_BYTES
    documented = re.search(
        r"Lambda image on the stand-in bases: ([\d.]+) GB", (ROOT / "images" / "README.md").read_text()
    )
    assert documented, "images/README.md states the measured size"
    assert abs(float(documented.group(1)) - size / 1e9) < 0.05, (documented.group(1), size)


def test_the_build_script_fails_over_the_limit(image: Built) -> None:
    """The same build again (every layer cached), checked against a limit it is over."""
    result = build("lambda", image.tag, "--limit-gb", "0.1")
    assert result.returncode == 1, result.stdout[-2000:]
    assert re.search(r"is [\d.]+ GB, over the 0.1 GB limit", result.stderr), result.stderr[-2000:]


def test_warmup_ping_finds_triton_and_the_model_ready(lam: Emulated) -> None:
    report = invoke(lam, json.loads(warmup_payload(dwell_ms=0, models=("add_sub",), probe=True)))
    assert report["triton_ready"] is True and report["models_ready"] == ["add_sub"], report


def test_signed_json_inference_with_the_key_from_secrets_manager(lam: Emulated) -> None:
    result = invoke(
        lam, signed("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY, {"content-type": "application/json"})
    )
    assert result["statusCode"] == 200, result
    outputs = {o["name"]: o["data"] for o in json.loads(result["body"])["outputs"]}
    assert outputs == {"OUTPUT0": [11, 22, 33, 44], "OUTPUT1": [-9, -18, -27, -36]}


def test_binary_tensors_travel_base64_both_ways(lam: Emulated) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    headers = {"inference-header-content-length": str(json_size), "content-type": "application/octet-stream"}
    result = invoke(lam, signed("POST", "/v2/models/add_sub/infer", body, headers, binary=True))
    assert result["statusCode"] == 200 and result["isBase64Encoded"] is True, result
    header_length = int(result["headers"]["inference-header-content-length"])
    parsed = httpclient.InferenceServerClient.parse_response_body(
        base64.b64decode(result["body"]), header_length=header_length
    )
    np.testing.assert_allclose(parsed.as_numpy("OUTPUT0"), a + a)


def _signed_with_another_key() -> dict[str, Any]:
    target = "/v2/models/add_sub/infer"
    signature = sign(b"not the secret", "POST", target, ADD_SUB_BODY)
    return http_event("POST", target, ADD_SUB_BODY, {"x-spillway-signature": signature})


# Events are made when the test runs: a signature made at collection could be stale by the time the
# image is built and started (the function refuses any older than 300 s).
@pytest.mark.parametrize(
    ("make", "status", "words"),
    [
        (lambda: http_event("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY), 401, "missing"),
        (_signed_with_another_key, 401, "wrong"),
        (lambda: signed("POST", "/v2/models/add_sub/infer", b'{"inputs": ['), 400, "parse"),
        (lambda: signed("POST", "/v2/models/zzz/infer", ADD_SUB_BODY), 404, "unknown model"),
    ],
    ids=["unsigned", "signed with another key", "malformed json", "unknown model"],
)
def test_bad_input_gets_a_clear_error(
    lam: Emulated, make: Callable[[], dict[str, Any]], status: int, words: str
) -> None:
    result = invoke(lam, make())
    assert result["statusCode"] == status, result
    assert words in json.loads(result["body"])["error"]


def test_sandbox_is_lambdas_and_the_shim_carries_the_python_backend(lam: Emulated) -> None:
    """Non-root, nothing writable but /tmp, no /dev/shm: the backend's regions live in /tmp."""
    probe = (
        "id -u; test -e /dev/shm || echo no-shm; touch /opt/spillway/x 2>/dev/null || echo read-only;"
        " ls /tmp/spillway-shm"
    )
    lines = exec_in(lam.name, "sh", "-c", probe).split()
    assert lines[:3] == ["10001", "no-shm", "read-only"], lines
    assert any(name.startswith("triton_python_backend_shm_region") for name in lines[3:]), lines
