"""AWS Lambda in ``RESPONSE_STREAM`` mode: ``python -m functions lambda-runtime`` on a real
tritonserver with the decoupled ``tokens`` model.

The official emulator reads a runtime's whole response before it answers, so the streaming
protocol (chunked, ``Lambda-Runtime-Function-Response-Mode: streaming``, the Function URL's
prelude, error trailers) is proven against a stand-in of the runtime API as AWS documents it
(``testing.lambda_runtime_api``); the same runtime's buffered answers are proven under the
official ``aws-lambda-rie``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from functions.lambda_stream import PRELUDE_END
from testing.function import STREAMING_RUNTIME, http_event, invoke, lambda_emulator, model_repository
from testing.lambda_runtime_api import Answer, RuntimeApiStandIn, runtime_api
from testing.paths import ROOT
from tests.integration.test_function_generate import prompt, text

pytestmark = pytest.mark.integration

STREAM = "/v2/models/tokens/generate_stream"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_repository(tmp_path_factory.mktemp("lambda-stream"), "tokens")


def _start(address: str, repo: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "AWS_LAMBDA_RUNTIME_API": address,
        "SPILLWAY_MODEL_REPOSITORY": str(repo),
        "SPILLWAY_MODELS": "tokens",
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, *STREAMING_RUNTIME], env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT
        )


@pytest.fixture(scope="module")
def api(repo: Path) -> Iterator[RuntimeApiStandIn]:
    with runtime_api() as (stand_in, address):
        proc = _start(address, repo, repo.parent / "runtime.log")
        try:
            yield stand_in
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _events(body: bytes) -> list[dict[str, object]]:
    return [json.loads(line[5:]) for line in body.decode().splitlines() if line.startswith("data:")]


def _prelude(answer: Answer) -> tuple[dict[str, object], bytes]:
    head, end, rest = answer.body.partition(PRELUDE_END)
    assert end, f"no prelude delimiter in {answer.body[:200]!r}"
    return json.loads(head), rest


def test_a_streamed_generation_reaches_the_runtime_api_token_by_token(
    api: RuntimeApiStandIn, repo: Path
) -> None:
    hold = repo / "tokens" / "hold"
    hold.touch()
    try:
        answer = api.invoke(http_event("POST", STREAM, prompt(3)))
        first = answer.next_chunk(timeout=120)  # the first invocation waits for the sidecar
        assert first is not None and first.endswith(PRELUDE_END), first
        assert json.loads(first[: -len(PRELUDE_END)])["statusCode"] == 200
        token = answer.next_chunk()
        assert token is not None and _events(token) == [
            {"model_name": "tokens", "model_version": "1", "text_output": "alpha "}
        ]
        assert not answer.done.is_set(), "the model still holds the second token"
    finally:
        hold.unlink(missing_ok=True)
    answer.wait()
    assert answer.headers["lambda-runtime-function-response-mode"] == "streaming"
    assert answer.headers["content-type"] == "application/vnd.awslambda.http-integration-response"
    assert answer.headers["transfer-encoding"] == "chunked"
    prelude, body = _prelude(answer)
    assert str(dict(prelude["headers"])["content-type"]).startswith("text/event-stream"), prelude  # type: ignore[call-overload]
    assert text(_events(body)) == "alpha beta gamma "
    assert answer.trailers == {}, "no error"


def test_every_other_invocation_is_answered_whole(api: RuntimeApiStandIn) -> None:
    generated = api.invoke(http_event("POST", "/v2/models/tokens/generate", prompt(2, stream=False))).wait()
    assert "lambda-runtime-function-response-mode" not in generated.headers
    result = json.loads(generated.body)
    assert result["statusCode"] == 200 and json.loads(result["body"])["text_output"] == "alpha beta "
    pinged = api.invoke({"spillway_warmup": {"dwell_ms": 0, "models": ["tokens"], "probe": False}}).wait()
    assert json.loads(pinged.body)["models_ready"] == ["tokens"], pinged.body


def test_an_unknown_event_fails_its_invocation_and_the_runtime_serves_on(api: RuntimeApiStandIn) -> None:
    failed = api.invoke({"not": "an event this function knows"}).wait()
    assert failed.error is not None and failed.error["errorType"] == "Runtime.UnknownEvent", failed.error
    assert failed.headers["lambda-runtime-function-error-type"] == "Runtime.UnknownEvent"
    after = api.invoke(http_event("POST", STREAM, prompt(1))).wait()
    assert text(_events(_prelude(after)[1])) == "alpha "


def test_a_set_up_that_fails_is_reported_to_init_error(tmp_path: Path) -> None:
    with runtime_api() as (stand_in, address):
        proc = _start(address, tmp_path / "no-such-repository", tmp_path / "runtime.log")
        assert proc.wait(timeout=120) == 1, (tmp_path / "runtime.log").read_text()
    assert stand_in.init_error is not None and stand_in.init_error["errorType"].startswith("Runtime."), (
        stand_in.init_error
    )


def test_the_streaming_runtime_answers_buffered_invocations_under_the_official_emulator(repo: Path) -> None:
    with lambda_emulator(repo, repo.parent, runtime=STREAMING_RUNTIME, SPILLWAY_MODELS="tokens") as running:
        result = invoke(running, http_event("POST", "/v2/models/tokens/generate", prompt(3, stream=False)))
    assert result["statusCode"] == 200, result
    assert json.loads(result["body"])["text_output"] == "alpha beta gamma "
