"""The real awslambdaric handler under the official aws-lambda-rie, with a real Triton sidecar."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from functions.contract import warmup_payload
from functions.signature import sign
from testing.function import (
    ADD_SUB_BODY,
    Running,
    http_event,
    invoke,
    lambda_emulator,
    load_event,
    model_repository,
)
from testing.http import http

pytestmark = pytest.mark.integration

KEY = b"lambda-test-key"
MAX_BODY = 32 * 1024


def signed(
    method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None, binary: bool = False
) -> dict[str, object]:
    signature = sign(KEY, method, target, body)
    return http_event(method, target, body, {"x-spillway-signature": signature, **(headers or {})}, binary)


@pytest.fixture(scope="module")
def lam(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("lambda")
    with lambda_emulator(
        model_repository(tmp, "add_sub"),
        tmp,
        SPILLWAY_SIGNING_KEY=KEY.decode(),
        SPILLWAY_MAX_BODY_BYTES=str(MAX_BODY),
    ) as running:
        yield running


def test_first_invocation_is_cold_and_runs_inference(lam: Running) -> None:
    result = invoke(
        lam, signed("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY, {"content-type": "application/json"})
    )
    assert result["statusCode"] == 200 and result["isBase64Encoded"] is False
    assert result["headers"]["x-spillway-cold"] == "1"
    assert json.loads(result["body"])["outputs"][0]["data"] == [11, 22, 33, 44]
    again = invoke(lam, signed("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY))
    assert "x-spillway-cold" not in again["headers"]
    assert again["headers"]["x-spillway-instance"] == result["headers"]["x-spillway-instance"]


def test_binary_tensors_travel_base64_both_ways(lam: Running) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 4], "FP32"),
        httpclient.InferInput("INPUT1", [1, 4], "FP32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(a, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    result = invoke(
        lam,
        signed(
            "POST",
            "/v2/models/add_sub/infer",
            body,
            {"inference-header-content-length": str(json_size), "content-type": "application/octet-stream"},
            binary=True,
        ),
    )
    assert result["statusCode"] == 200 and result["isBase64Encoded"] is True
    raw = base64.b64decode(result["body"])
    header_length = int(result["headers"]["inference-header-content-length"])
    parsed = httpclient.InferenceServerClient.parse_response_body(raw, header_length=header_length)
    np.testing.assert_allclose(parsed.as_numpy("OUTPUT0"), a + a)


def test_http_api_event_with_query_string(lam: Running) -> None:
    event = load_event("http_api_v2.json")
    event["headers"]["x-spillway-signature"] = sign(KEY, "GET", "/v2/models/add_sub?verbose=1", b"")
    result = invoke(lam, event)
    assert result["statusCode"] == 200 and json.loads(result["body"])["name"] == "add_sub"


def test_scheduler_warmup_event_answers_the_contract(lam: Running) -> None:
    report = invoke(lam, json.loads(warmup_payload(dwell_ms=100, models=("add_sub",), probe=True)))
    assert set(report) == {"instance_id", "cold", "init_ms", "uptime_s", "triton_ready", "models_ready"}
    assert report["triton_ready"] is True and report["models_ready"] == ["add_sub"]
    assert report["init_ms"] > 0
    assert (
        invoke(lam, load_event("eventbridge_scheduler_warmup.json"))["instance_id"] == report["instance_id"]
    )


def test_unknown_event_shape_is_a_clear_invocation_error(lam: Running) -> None:
    error = invoke(lam, {"Records": [{"eventSource": "aws:s3"}]})
    assert error["errorType"] == "UnknownEvent" and "unknown event shape" in error["errorMessage"]
    assert invoke(lam, signed("GET", "/v2/health/ready"))["statusCode"] == 200


BAD = {
    "missing signature": (
        lambda: http_event("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY),
        401,
        "missing",
    ),
    "wrong signature": (
        lambda: http_event(
            "POST",
            "/v2/models/add_sub/infer",
            ADD_SUB_BODY,
            {"x-spillway-signature": sign(b"other key", "POST", "/v2/models/add_sub/infer", ADD_SUB_BODY)},
        ),
        401,
        "wrong",
    ),
    "stale signature": (
        lambda: http_event(
            "POST",
            "/v2/models/add_sub/infer",
            ADD_SUB_BODY,
            {
                "x-spillway-signature": sign(
                    KEY, "POST", "/v2/models/add_sub/infer", ADD_SUB_BODY, now=1_000_000_000
                )
            },
        ),
        401,
        "stale",
    ),
    "unsigned payload not allowed": (
        lambda: http_event(
            "POST",
            "/v2/models/add_sub/infer",
            ADD_SUB_BODY,
            {"x-spillway-signature": sign(KEY, "POST", "/v2/models/add_sub/infer", None)},
        ),
        401,
        "wrong",
    ),
    "malformed json": (lambda: signed("POST", "/v2/models/add_sub/infer", b'{"inputs": ['), 400, "parse"),
    "wrong datatype": (
        lambda: signed("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY.replace(b"FP32", b"INT32", 1)),
        400,
        "data-type",
    ),
    "unknown model": (lambda: signed("POST", "/v2/models/zzz/infer", ADD_SUB_BODY), 404, "unknown model"),
    "body over the limit": (
        lambda: signed("POST", "/v2/models/add_sub/infer", b"0" * (MAX_BODY + 1)),
        413,
        "limit",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_gets_a_clear_error_and_the_instance_keeps_serving(lam: Running, case: str) -> None:
    make, status, words = BAD[case]
    result = invoke(lam, make())
    assert result["statusCode"] == status, result
    assert words in json.loads(result["body"])["error"]
    assert invoke(lam, signed("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY))["statusCode"] == 200


def test_replayed_signature_is_refused(lam: Running) -> None:
    event = signed("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY)
    assert invoke(lam, event)["statusCode"] == 200
    replay = invoke(lam, event)
    assert replay["statusCode"] == 401 and "replayed" in json.loads(replay["body"])["error"]


def test_too_little_time_left_gets_504_without_running(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("short")
    with lambda_emulator(
        # The margin keeps back all but 10 ms of the invocation's time, however long a loaded host
        # takes to reach the handler (a short function timeout would let the emulator kill it first).
        model_repository(tmp, "add_sub"),
        tmp,
        timeout_s=10,
        SPILLWAY_DEADLINE_MARGIN_MS="9990",
    ) as running:
        result = invoke(running, http_event("POST", "/v2/models/add_sub/infer", ADD_SUB_BODY))
        assert result["statusCode"] == 504 and "too little time" in json.loads(result["body"])["error"]


def test_missing_model_fails_the_init_phase(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("init-error")
    with lambda_emulator(
        model_repository(tmp, "add_sub"), tmp, SPILLWAY_MODELS="add_sub,not_there"
    ) as running:
        _, _, body = http("POST", running.url, json.dumps(load_event("function_url.json")).encode())
        log = running.log_text()
    error = json.loads(body)
    assert error["errorType"] == "SidecarFailed", error
    assert "model 'not_there' is not in the model repository" in error["errorMessage"]
    assert "INIT RTDONE(status: error)" in log
