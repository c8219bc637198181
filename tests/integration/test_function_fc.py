"""The FC custom-container server driven over HTTP the way FC drives it, with a real Triton sidecar."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from functions.contract import warmup_payload
from testing.function import ADD_SUB_BODY, Running, function_server, http_event, load_event, model_repository
from testing.http import http, wait_until

pytestmark = pytest.mark.integration

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def fc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("fc")
    repo = model_repository(tmp, "add_sub", "slow")
    with function_server(
        repo,
        tmp,
        SPILLWAY_REQUEST_TIMEOUT_S="1",
        SPILLWAY_DEADLINE_MARGIN_MS="100",
        SPILLWAY_MAX_BODY_BYTES=str(MAX_BODY),
    ) as running:
        yield running


def infer(
    fc: Running, body: bytes = ADD_SUB_BODY, model: str = "add_sub", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    return http(
        "POST",
        f"{fc.url}/v2/models/{model}/infer",
        body,
        {"content-type": "application/json", **(headers or {})},
    )


def assert_still_serving(fc: Running) -> None:
    status, _, body = infer(fc)
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [11, 22, 33, 44]


def test_initialize_waits_for_the_sidecar_and_names_the_instance(fc: Running) -> None:
    status, headers, body = http("POST", fc.url + "/initialize", b"", {"x-fc-initialization-timeout": "10"})
    report = json.loads(body)
    assert status == 200
    assert report["instance_id"] == headers["x-spillway-instance"]
    assert report["init_ms"] > 0


def test_timer_trigger_warmup_reports_the_instance(fc: Running) -> None:
    event = load_event("fc_timer.json")
    event["payload"] = warmup_payload(dwell_ms=50, models=("add_sub",), probe=True)
    status, headers, body = http(
        "POST", fc.url + "/invoke", json.dumps(event).encode(), {"content-type": "application/octet-stream"}
    )
    report = json.loads(body)
    assert status == 200 and "x-fc-status" not in headers
    assert report["triton_ready"] is True
    assert report["models_ready"] == ["add_sub"]
    assert report["instance_id"] == headers["x-spillway-instance"]
    assert report["uptime_s"] > 0


def test_http_trigger_inference_with_tritonclient(fc: Running) -> None:
    client = httpclient.InferenceServerClient(fc.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add_sub")
    assert [i["name"] for i in client.get_model_metadata("add_sub")["inputs"]] == ["INPUT0", "INPUT1"]
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, dtype=np.float32)
    for binary in (True, False):
        inputs = [
            httpclient.InferInput("INPUT0", [2, 4], "FP32"),
            httpclient.InferInput("INPUT1", [2, 4], "FP32"),
        ]
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_data_from_numpy(b, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
        result = client.infer("add_sub", inputs, outputs=outputs)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)


def test_every_answer_names_the_instance_and_only_the_first_is_cold(fc: Running) -> None:
    answers = [infer(fc)[1] for _ in range(3)]
    assert len({h["x-spillway-instance"] for h in answers}) == 1
    assert all("x-spillway-cold" not in h for h in answers)


def test_invoke_with_an_http_event_answers_in_the_function_url_shape(fc: Running) -> None:
    event = http_event("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY, {"content-type": "application/json"})
    status, _, body = http("POST", fc.url + "/invoke", json.dumps(event).encode())
    result = json.loads(body)
    assert status == 200 and result["statusCode"] == 200
    assert json.loads(result["body"])["outputs"][1]["data"] == [-9, -18, -27, -36]


@pytest.mark.parametrize(
    "body", [b"not json", b"[1, 2]", b'{"event": "something else"}', b'{"spillway_warmup": {"dwell_ms": -5}}']
)
def test_invoke_with_an_unknown_event_fails_the_invocation_clearly(fc: Running, body: bytes) -> None:
    status, headers, raw = http("POST", fc.url + "/invoke", body)
    assert status == 400 and headers["x-fc-status"] == "404"
    assert json.loads(raw)["error"]
    assert_still_serving(fc)


CASES = {
    "malformed json": (b'{"inputs": [', "add_sub", {}, 400, "parse"),
    "header length past the body": (
        ADD_SUB_BODY,
        "add_sub",
        {"inference-header-content-length": str(len(ADD_SUB_BODY) + 10)},
        400,
        "header",
    ),
    "wrong datatype": (ADD_SUB_BODY.replace(b"FP32", b"INT32", 1), "add_sub", {}, 400, "data-type"),
    "wrong shape": (ADD_SUB_BODY.replace(b"[1, 4]", b"[1, 3]", 1), "add_sub", {}, 400, "shape"),
    "wrong tensor size": (
        ADD_SUB_BODY.replace(b"[1, 2, 3, 4]", b"[1, 2, 3]", 1),
        "add_sub",
        {},
        400,
        "shape",
    ),
    "unknown model": (ADD_SUB_BODY, "nope", {}, 404, "unknown model"),
    "unknown version": (ADD_SUB_BODY, "add_sub/versions/7", {}, 404, "version 7"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_inference_input_gets_a_clear_error_and_the_instance_keeps_serving(
    fc: Running, case: str
) -> None:
    body, model, headers, expected, words = CASES[case]
    status, _, raw = infer(fc, body, model, headers)
    assert status == expected, raw
    assert words in json.loads(raw)["error"]
    assert_still_serving(fc)


def test_body_over_the_limit_gets_413_before_triton(fc: Running) -> None:
    status, headers, raw = infer(fc, b"x" * (MAX_BODY + 1))
    assert status == 413 and str(MAX_BODY) in json.loads(raw)["error"]
    assert headers["connection"] == "close"
    assert_still_serving(fc)


def test_chunked_body_over_the_limit_gets_413(fc: Running) -> None:
    host, port = fc.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"y" * 16384
        for _ in range(MAX_BODY // len(chunk) + 2):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert_still_serving(fc)


def test_pipelined_requests_are_answered_in_order(fc: Running) -> None:
    host, port = fc.url.removeprefix("http://").split(":")
    one = (
        b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(ADD_SUB_BODY), ADD_SUB_BODY)
    )
    two = b"GET /v2/models/nope HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(one + two)
        received = b""
        while received.count(b"HTTP/1.1 ") < 2 or not received.rstrip().endswith(b"}"):
            received += sock.recv(65536)
    first, second = received.split(b"HTTP/1.1 ")[1:3]
    assert first.startswith(b"200") and second.startswith(b"404")


def test_garbage_on_the_socket_gets_400(fc: Running) -> None:
    host, port = fc.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01\x00\xa5garbage\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
    assert_still_serving(fc)


def slow_body(delay_ms: float) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "FP32", "data": [delay_ms]}]}
    ).encode()


def test_a_request_past_its_deadline_gets_504_and_the_instance_recovers(fc: Running) -> None:
    status, _, raw = infer(fc, slow_body(2000), "slow")
    assert status == 504 and "did not finish" in json.loads(raw)["error"]
    wait_until(lambda: infer(fc, slow_body(1), "slow")[0] == 200, 10, "the slow model answering again")


def test_unknown_path_gets_404_naming_what_is_served(fc: Running) -> None:
    status, _, raw = http("GET", fc.url + "/nope")
    assert status == 404 and "/v2/" in json.loads(raw)["error"]


def test_warmup_over_http_and_metrics(fc: Running) -> None:
    status, _, raw = http("POST", fc.url + "/spillway/warmup", warmup_payload(probe=True).encode())
    assert status == 200 and set(json.loads(raw)["models_ready"]) == {"add_sub", "slow"}
    status, _, raw = http("POST", fc.url + "/spillway/warmup", b'{"spillway_warmup": {"probe": "maybe"}}')
    assert status == 400 and "probe" in json.loads(raw)["error"]
    status, headers, raw = http("GET", fc.url + "/spillway/metrics")
    text = raw.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert 'spillway_function_requests_total{code="200",kind="infer"}' in text
    assert "spillway_function_sidecar_up 1.0" in text
    assert "spillway_function_cold_starts_total 1.0" in text


def test_requests_during_sidecar_start_get_503_with_retry_after(tmp_path: Path) -> None:
    repo = model_repository(tmp_path, "add_sub", "slow")
    with function_server(repo, tmp_path, wait_ready=False, SLOW_INIT_DELAY_S="3") as running:

        def answered() -> bool:
            try:
                return http("GET", running.url + "/v2/health/live", timeout=1)[0] > 0
            except OSError:
                return False

        wait_until(answered, 30, "function listening")
        status, headers, raw = infer(running)
        assert status == 503 and headers["retry-after"] == "1"
        assert "starting" in json.loads(raw)["error"]
        status, _, raw = http("POST", running.url + "/initialize", b"")
        assert status == 200, raw
        assert_still_serving(running)
