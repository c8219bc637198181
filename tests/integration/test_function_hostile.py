"""A real function (FC server, real Triton) attacked as a client would: admin paths, the sidecar's
environment, huge headers, malformed signatures, a dead backend stub."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from functions.sidecar import free_port
from functions.signature import sign
from testing.function import ADD_SUB_BODY, Running, function_server, model_repository
from testing.gateway import devgateway
from testing.http import http, wait_until

pytestmark = pytest.mark.integration

KEY = "hostile-test-signing-key-0123456789abcdef"
CLOUD_SECRET = "cloud-secret-that-must-stay-in-the-handler"

PWN_CONFIG = 'name: "pwn"\nbackend: "python"\nmax_batch_size: 0\n'
PWN_MODEL = (
    "import pathlib\n"
    "pathlib.Path('{marker}').write_text('ran')\n"
    "class TritonPythonModel:\n"
    "    def execute(self, requests):\n"
    "        return []\n"
)


@pytest.fixture(scope="module")
def fn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, int]]:
    tmp = tmp_path_factory.mktemp("hostile")
    triton_port = free_port()
    with function_server(
        model_repository(tmp, "add_sub"),
        tmp,
        SPILLWAY_SIGNING_KEY=KEY,
        SPILLWAY_TRITON_HTTP_PORT=str(triton_port),
        AWS_SECRET_ACCESS_KEY=CLOUD_SECRET,
        ALIBABA_CLOUD_ACCESS_KEY_SECRET=CLOUD_SECRET,
    ) as running:
        yield running, triton_port


def signed(
    fn: Running, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """A correctly signed request, so only the function's surface decides the answer."""
    signature = sign(KEY.encode(), method, target, body)
    all_headers = {"x-spillway-signature": signature, "content-type": "application/json", **(headers or {})}
    return raw_request(fn, method, target, body, all_headers)


def raw_request(
    fn: Running, method: str, target: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """The target byte for byte, with no client-side normalisation of the path."""
    import http.client

    host, port = fn.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, target, body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def load_request(marker: Path) -> bytes:
    files = {
        "file:config.pbtxt": base64.b64encode(PWN_CONFIG.encode()).decode(),
        "file:1/model.py": base64.b64encode(PWN_MODEL.format(marker=marker).encode()).decode(),
    }
    return json.dumps({"parameters": {"config": json.dumps({"backend": "python"}), **files}}).encode()


def assert_serving(fn: Running) -> None:
    status, _, body = signed(fn, "POST", "/v2/models/add_sub/infer", ADD_SUB_BODY)
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [11, 22, 33, 44]


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/pwn/load"),
        ("POST", "/v2/repository/models/add_sub/unload"),
        ("POST", "//v2/repository/models/pwn/load"),
        ("POST", "/v2/./repository/models/pwn/load"),
        ("POST", "/v2/%72epository/models/pwn/load"),
        ("POST", "/v2/models/../repository/models/pwn/load"),
        ("POST", "/v2/models/add_sub/../../repository/models/add_sub/unload"),
        ("GET", "/v2/models/add_sub/config"),
        ("POST", "/v2/logging"),
        ("POST", "/v2/trace/setting"),
        ("GET", "/v2/systemsharedmemory/status"),
        ("POST", "/v2/cudasharedmemory/region/x/register"),
    ],
)
def test_administration_is_closed_in_every_spelling(
    fn: tuple[Running, int], tmp_path: Path, method: str, target: str
) -> None:
    running, _ = fn
    marker = tmp_path / "model-code-ran"
    status, _, body = signed(running, method, target, load_request(marker) if "load" in target else b"")
    assert status == 403, body
    assert "not served by this function" in json.loads(body)["error"]
    assert not marker.exists()
    assert_serving(running)


@pytest.mark.parametrize(
    "target",
    [
        "/v2/%2572epository/models/pwn/load",
        "/v2/models/add_su%2562/infer",
        "/v2/models/add_sub/%252e%252e/%252e%252e/repository/index",
        "/v2/models/x%252F..%252F..%252Frepository/index",
    ],
)
def test_a_path_encoded_more_than_once_is_refused_not_decoded_again(
    fn: tuple[Running, int], tmp_path: Path, target: str
) -> None:
    """nginx decodes a path once and APISIX picks the route (and its residency) on that reading; a
    function that decoded again would serve a path no route was chosen for (``add_su%2562`` reads
    ``add_su%62`` at the gateway, ``add_sub`` after a second decoding). It answers 400 instead."""
    running, _ = fn
    marker = tmp_path / "model-code-ran"
    status, _, body = signed(
        running, "POST", target, load_request(marker) if "load" in target else ADD_SUB_BODY
    )
    assert status == 400 and "more than once" in json.loads(body)["error"], (target, body)
    assert not marker.exists()
    assert_serving(running)


def test_statistics_are_refused_naming_the_setting_that_serves_them(fn: tuple[Running, int]) -> None:
    running, _ = fn
    for target in ("/v2/models/stats", "/v2/models/add_sub/stats", "/v2/models/add_sub/versions/1/stats"):
        status, _, body = signed(running, "GET", target)
        assert status == 403 and "SPILLWAY_EXPOSE_STATISTICS=1" in json.loads(body)["error"], (target, body)


def test_wrong_methods_on_served_paths_get_405_with_allow(fn: tuple[Running, int]) -> None:
    running, _ = fn
    status, headers, _ = signed(running, "GET", "/v2/models/add_sub/infer")
    assert (status, headers.get("allow")) == (405, "POST")
    status, headers, _ = signed(running, "DELETE", "/v2/models/add_sub")
    assert (status, headers.get("allow")) == (405, "GET")


def test_served_paths_still_answer(fn: tuple[Running, int]) -> None:
    running, _ = fn
    for target in ("/v2", "/v2/health/ready", "/v2/models/add_sub", "/v2/models/add_sub/versions/1/ready"):
        status, _, body = signed(running, "GET", target)
        assert status == 200, (target, body)
    status, _, _ = signed(running, "POST", "/v2//models/./add_sub/infer", ADD_SUB_BODY)
    assert status == 200, "a path that normalises to a served one is served"


def test_triton_itself_refuses_administration_to_any_local_caller(
    fn: tuple[Running, int], tmp_path: Path
) -> None:
    """Behind the allow-list: even a caller that reaches the sidecar's port cannot load or unload."""
    running, triton_port = fn
    marker = tmp_path / "model-code-ran"
    for path, body in (
        ("/v2/repository/models/pwn/load", load_request(marker)),
        ("/v2/repository/models/add_sub/unload", b""),
        ("/v2/repository/index", b""),
    ):
        status, _, answer = http("POST", f"http://127.0.0.1:{triton_port}{path}", body)
        assert status == 403 and b"restricted" in answer, (path, answer)
    assert not marker.exists()
    assert_serving(running)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode(errors="replace").split("\0") if "=" in entry)


def test_triton_and_model_code_see_no_key_and_no_cloud_credentials(fn: tuple[Running, int]) -> None:
    running, _ = fn
    triton = running.triton_pid()
    stubs = [int(p) for p in Path(f"/proc/{triton}/task/{triton}/children").read_text().split()]
    assert stubs, "the Python backend runs its model code in stub processes under Triton"
    assert _environ(running.proc.pid)["SPILLWAY_SIGNING_KEY"] == KEY, "the handler itself does hold it"
    for pid in (triton, *stubs):
        environ = _environ(pid)
        leaked = [k for k, v in environ.items() if KEY in v or CLOUD_SECRET in v or "SIGNING_KEY" in k]
        assert not leaked, (pid, leaked)
        assert "PATH" in environ


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_a_one_mib_header_gets_431_and_memory_barely_moves(fn: tuple[Running, int]) -> None:
    running, _ = fn
    before = _rss_kib(running.proc.pid)
    port = int(running.url.rsplit(":", 1)[1])
    statuses = []
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: ")
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"a" * (1 << 20) + b"\r\n\r\n")
            statuses.append(sock.recv(64).split(b" ")[1])
    growth_mib = (_rss_kib(running.proc.pid) - before) / 1024
    assert statuses == [b"431"] * 5
    assert growth_mib < 10, f"RSS grew by {growth_mib:.1f} MiB"
    assert_serving(running)


# What the function passes on to Triton: a request target, and each header value, of at most this
# many bytes (Triton 2.51's HTTP server closes the connection past 8,189 bytes of target, and drops
# some requests from about 7,950).
FORWARDED_LIMIT = 4096


def _padded(target: str, size: int) -> str:
    """``target`` with a query argument that makes it exactly ``size`` bytes long."""
    return f"{target}?pad=" + "a" * (size - len(target) - len("?pad="))


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [("GET", "/v2/health/ready", b""), ("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY)],
    ids=["health", "infer"],
)
def test_the_longest_request_target_the_function_forwards_reaches_triton(
    fn: tuple[Running, int], method: str, target: str, body: bytes
) -> None:
    running, _ = fn
    status, _, answer = signed(running, method, _padded(target, FORWARDED_LIMIT), body)
    assert status == 200, answer


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        ("GET", _padded("/v2/health/ready", 16_000), b""),
        ("GET", _padded("/v2/health/ready", FORWARDED_LIMIT + 1), b""),
        ("POST", _padded("/v2/models/add_sub/infer", FORWARDED_LIMIT + 1), ADD_SUB_BODY),
        ("POST", _padded("/v2/models/add_sub/infer", 8000), ADD_SUB_BODY),
        ("GET", "/v2/models/" + "m" * FORWARDED_LIMIT, b""),
    ],
    ids=["the reported 16 KB query", "one byte past", "infer", "near Triton's limit", "a long model name"],
)
def test_a_request_target_longer_than_triton_takes_gets_414_naming_the_limit(
    fn: tuple[Running, int], method: str, target: str, body: bytes
) -> None:
    running, _ = fn
    status, headers, answer = signed(running, method, target, body)
    assert status == 414, answer
    assert "retry-after" not in headers
    message = json.loads(answer)["error"]
    assert f"{FORWARDED_LIMIT} bytes" in message and "retry" not in message, message
    assert_serving(running)


@pytest.mark.parametrize("size", [FORWARDED_LIMIT, FORWARDED_LIMIT + 1, 16_000])
def test_a_forwarded_header_longer_than_triton_takes_gets_431_naming_it(
    fn: tuple[Running, int], size: int
) -> None:
    running, _ = fn
    content_type = "application/json;p=" + "a" * (size - len("application/json;p="))
    infer = "/v2/models/add_sub/infer"
    status, _, answer = signed(running, "POST", infer, ADD_SUB_BODY, {"content-type": content_type})
    if size <= FORWARDED_LIMIT:
        assert status == 200, answer
        return
    assert status == 431, answer
    message = json.loads(answer)["error"]
    assert "content-type" in message and f"{FORWARDED_LIMIT} bytes" in message, message


@pytest.mark.parametrize(
    "value",
    [
        "t=\u00b2,n=abc,v1=" + "0" * 64,
        "t=" + "9" * 5000 + ",n=abc,v1=" + "0" * 64,
        f"t={int(time.time())},n=abc,v1=" + "\u00e9" * 64,
    ],
    ids=["superscript digit", "5000 digits", "non-ascii mac"],
)
def test_malformed_signatures_get_401_not_500(fn: tuple[Running, int], value: str) -> None:
    running, _ = fn
    port = int(running.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Spillway-Signature: "
            + value.encode("utf-8")
            + b"\r\n\r\n"
        )
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert b"malformed X-Spillway-Signature" in answer


def test_a_killed_backend_stub_is_replaced_and_meanwhile_every_answer_is_200_or_503(tmp_path: Path) -> None:
    answers: list[tuple[int, str | None, bytes]] = []
    stop = threading.Event()
    with function_server(model_repository(tmp_path, "add_sub"), tmp_path, platform="local") as running:
        url = running.url + "/v2/models/add_sub/infer"

        def client() -> None:
            while not stop.is_set():
                status, headers, body = http("POST", url, ADD_SUB_BODY, {"content-type": "application/json"})
                answers.append((status, headers.get("retry-after"), body))

        worker = threading.Thread(target=client)
        worker.start()
        wait_until(lambda: len(answers) > 20, 30, "traffic flowing")
        triton = running.triton_pid()
        stub = int(Path(f"/proc/{triton}/task/{triton}/children").read_text().split()[0])
        killed_at = len(answers)
        started = time.monotonic()
        os.kill(stub, signal.SIGKILL)
        wait_until(lambda: answers[-1][0] == 200 and len(answers) > killed_at + 1, 60, "serving again")
        recovered_s = time.monotonic() - started
        stop.set()
        worker.join(30)
        _, _, metrics = http("GET", running.url + "/spillway/metrics")
    after = answers[killed_at:]
    assert all(status in (200, 503) for status, _, _ in after), [a for a in after if a[0] not in (200, 503)]
    assert any(status == 503 for status, _, _ in after), "no 503 while the backend was restarted"
    assert all(retry == "1" for status, retry, _ in after if status == 503)
    assert b"spillway_function_sidecar_restarts_total 1.0" in metrics
    print(f"killed stub: serving again after {recovered_s:.2f} s")


def test_administration_through_the_gateway_is_refused_by_the_function(
    fn: tuple[Running, int], tmp_path: Path
) -> None:
    """The reported attack: a public request spills, the gateway signs it, the function must refuse."""
    running, _ = fn
    config = {
        "targets": [
            {"name": "aws", "kind": "http", "url": running.url, "cold_start_ms": 0, "sign_body": True}
        ],
        "rules": [{"name": "all-out", "action": "target", "targets": ["aws"]}],
        "metrics": {"listen": None},
        "devgateway": {"upstreams": {"local": "http://127.0.0.1:9", "aws": running.url}},
    }
    marker = tmp_path / "model-code-ran"
    with devgateway(config, tmp_path, SPILLWAY_SIGNING_KEY=KEY) as (url, _):
        headers = {"x-data-classification": "public", "content-type": "application/json"}
        status, answer_headers, body = http(
            "POST", url + "/v2/repository/models/pwn/load", load_request(marker), headers
        )
        assert answer_headers.get("x-spillway-decision", "").startswith("aws;"), answer_headers
        assert status == 403, body
        status, _, body = http("POST", url + "/v2/models/add_sub/infer", ADD_SUB_BODY, headers)
        assert status == 200, body
    assert not marker.exists()
