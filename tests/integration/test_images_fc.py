"""The FC image recipe (images/aliyun-fc/Dockerfile) built on a stand-in for NVIDIA's Triton image:
Debian bookworm with /opt/tritonserver laid out as NGC lays it out, from the pytriton wheel's
server (CPU), and placeholders for the backends and libraries the recipe prunes. It proves the
pruning, the size guard, the venv, the entrypoint, port 9000, /initialize, /invoke and the HTTP
trigger path; not CUDA, the GPU backends or the real base's size (images/README.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from functions.contract import warmup_payload
from functions.sidecar import free_port
from functions.signature import sign
from testing.function import ADD_SUB_BODY
from testing.http import http, wait_until
from testing.images import (
    Built,
    build,
    built_image,
    container,
    engine,
    logs,
    missing_reason,
    remove_image,
    running,
    terraform_environment,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(missing_reason()), reason=str(missing_reason())),
]

KEY = "fc-image-test-key-" + os.urandom(8).hex()
KEY_OSS = {"bucket": "keys", "object_dir": "fn", "file_name": "signing.key", "endpoint": None}


@pytest.fixture(scope="module")
def image() -> Iterator[Built]:
    with built_image("fc", f"localhost/spillway-test-aliyun-fc:{os.getpid()}") as built:
        yield built


@dataclass(frozen=True)
class Fc:
    url: str
    name: str


@pytest.fixture(scope="module")
def fc(image: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fc]:
    """As FC runs it: the image's own entrypoint and command, its user, the module's environment
    and the signing key on a read-only mount; port 9000 published on loopback only (slirp4netns:
    nothing but loopback on the host)."""
    env = terraform_environment("aliyun_function", signing_key_oss=KEY_OSS)
    key_file = Path(env["SPILLWAY_SIGNING_KEY_FILE"])
    key_dir = tmp_path_factory.mktemp("oss-mount")
    (key_dir / key_file.name).write_text(KEY + "\n")
    key_dir.chmod(0o755)
    (key_dir / key_file.name).chmod(0o644)
    port = free_port()
    name = f"spillway-test-fc-{os.getpid()}"
    options = [
        "--network=slirp4netns:port_handler=slirp4netns",
        f"--publish=127.0.0.1:{port}:9000",
        f"--volume={key_dir}:{key_file.parent}:ro",
        *(f"--env={k}={v}" for k, v in env.items()),
    ]
    with container(image.tag, name, options):
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if not running(name):
                raise RuntimeError(f"the container stopped:\n{logs(name)[-4000:]}")
            try:
                return (
                    http(
                        "GET",
                        url + "/v2/health/ready",
                        headers=signed_headers("GET", "/v2/health/ready"),
                        timeout=2,
                    )[0]
                    == 200
                )
            except OSError:
                return False

        wait_until(ready, 90, "the FC function ready on port 9000")
        yield Fc(url, name)


def signed_headers(method: str, target: str, body: bytes = b"") -> dict[str, str]:
    return {"x-spillway-signature": sign(KEY.encode(), method, target, body)}


def listing(image: Built, *command: str) -> list[str]:
    out = engine(
        "podman", "run", "--rm", "--network=none", "--user=0", "--entrypoint=[]", image.tag, *command
    ).stdout
    return out.split()


def test_pruning_keeps_the_python_backend_and_drops_the_rest(image: Built) -> None:
    for line in (
        "keeping backend python",
        "removing backend onnxruntime",
        "removing backend pytorch",
        "removing TensorRT",
        "removing cuDNN",
    ):
        assert line in image.output, line
    assert listing(image, "ls", "/opt/tritonserver/backends") == ["python"]
    assert (
        listing(
            image,
            "find",
            "/",
            "-xdev",
            "-name",
            "libnvinfer*",
            "-o",
            "-name",
            "libcudnn*",
            "-o",
            "-name",
            "*_static.a",
        )
        == []
    )


def test_image_config_is_what_the_module_runs(image: Built) -> None:
    config = image.config()
    assert config["Entrypoint"] == ["/opt/spillway/entrypoint.sh"]
    assert config["Cmd"] == ["python", "-m", "functions", "serve", "--platform", "aliyun-fc"]
    assert config["User"] == "1000:1000" and "9000/tcp" in config["ExposedPorts"]
    assert "SPILLWAY_GPU_METRICS=1" in config["Env"], "the GPU image shows its GPU on /spillway/metrics"
    assert listing(image, "python", "-c", "import sys; print(sys.version_info >= (3, 11), sys.prefix)") == [
        "True",
        "/opt/spillway/venv",
    ]


def test_initialize_then_invoke_events(fc: Fc) -> None:
    status, headers, body = http("POST", fc.url + "/initialize", b"", signed_headers("POST", "/initialize"))
    assert status == 200 and json.loads(body)["instance_id"] == headers["x-spillway-instance"], body
    ping = warmup_payload(dwell_ms=0, models=("add_sub",), probe=True).encode()
    status, _, body = http("POST", fc.url + "/invoke", ping, signed_headers("POST", "/invoke", ping))
    assert status == 200 and json.loads(body)["models_ready"] == ["add_sub"], body
    bad = b'{"Records": []}'
    status, headers, _ = http("POST", fc.url + "/invoke", bad, signed_headers("POST", "/invoke", bad))
    assert headers.get("x-fc-status") == "404"


def test_http_trigger_serves_signed_inference_and_refuses_unsigned(fc: Fc) -> None:
    target = "/v2/models/add_sub/infer"
    status, _, body = http(
        "POST", fc.url + target, ADD_SUB_BODY, signed_headers("POST", target, ADD_SUB_BODY)
    )
    assert status == 200, body
    assert {o["name"]: o["data"] for o in json.loads(body)["outputs"]}["OUTPUT0"] == [11, 22, 33, 44]
    status, _, body = http("POST", fc.url + target, ADD_SUB_BODY)
    assert status == 401 and b"missing" in body


def stage(tag: str, *args: str) -> tuple[int, str]:
    """Only the pruning stage, with these build arguments."""
    result = build("fc", tag, "--target", "triton", *args)
    remove_image(tag)
    return result.returncode, result.stdout + result.stderr


def test_backends_to_keep_are_a_build_argument(image: Built) -> None:
    tag = f"localhost/spillway-test-fc-prune:{os.getpid()}"
    code, out = stage(tag, "--build-arg", "TRITON_BACKENDS=python,onnxruntime")
    assert code == 0, out[-3000:]
    for line in (
        "keeping backend onnxruntime",
        "keeping TensorRT for onnxruntime",
        "keeping cuDNN for onnxruntime",
        "removing backend pytorch",
    ):
        assert line in out, line
    code, out = stage(tag, "--build-arg", "TRITON_BACKENDS=python,tensorflow")
    assert code != 0 and "TRITON_BACKENDS names 'tensorflow', which this base does not have" in out


def test_size_guard_fails_the_build_over_the_limit(image: Built) -> None:
    code, out = stage(f"localhost/spillway-test-fc-guard:{os.getpid()}", "--build-arg", "MAX_TREE_MB=100")
    assert code != 0 and "over MAX_TREE_MB=100" in out, out[-3000:]
