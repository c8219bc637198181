"""LLM generation through the function: Triton's ``generate`` and ``generate_stream`` on a real
tritonserver with a decoupled Python-backend model (``tests/model_repository/tokens``), streamed
by the FC server as the model makes each token, answered whole by the Lambda handler under the
official emulator (an invocation answers at once)."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.function import Running, function_server, http_event, invoke, lambda_emulator, model_repository
from testing.http import http, wait_until
from testing.sse import EventStream

pytestmark = pytest.mark.integration

WORDS = "alpha beta gamma delta"


def prompt(tokens: int, delay_ms: float = 0, stream: bool = True) -> bytes:
    return json.dumps(
        {"text_input": WORDS, "max_tokens": tokens, "token_delay_ms": delay_ms, "stream": stream}
    ).encode()


def text(events: list[dict[str, object]]) -> str:
    return "".join(str(event["text_output"]) for event in events)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_repository(tmp_path_factory.mktemp("generate"), "tokens")


@pytest.fixture(scope="module")
def fc(repo: Path) -> Iterator[Running]:
    # A client that stops reading is let go after SPILLWAY_BODY_TIMEOUT_S: 3 s here.
    with function_server(repo, repo.parent, SPILLWAY_MODELS="tokens", SPILLWAY_BODY_TIMEOUT_S="3") as running:
        yield running


@pytest.fixture
def hold(repo: Path) -> Iterator[Path]:
    """While this file is there, the model sends its first token and waits before the second."""
    flag = repo / "tokens" / "hold"
    flag.touch()
    yield flag
    flag.unlink(missing_ok=True)


def stream_url(fc: Running) -> str:
    return f"{fc.url}/v2/models/tokens/generate_stream"


def served(fc: Running, kind: str) -> float:
    """The function's own count of answered requests of ``kind``, any status."""
    _, _, body = http("GET", f"{fc.url}/spillway/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("spillway_function_requests_total{") and f'kind="{kind}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_each_token_leaves_the_function_as_the_model_makes_it(fc: Running, hold: Path) -> None:
    with EventStream(stream_url(fc), prompt(4)) as events:
        assert events.status == 200
        assert events.headers["content-type"].startswith("text/event-stream")
        assert events.headers["transfer-encoding"] == "chunked"
        # The model has made one token and waits: a function that buffered would send nothing yet.
        first = events.next()
        assert first is not None and first["text_output"] == "alpha "
        hold.unlink()
        rest = events.rest()
    assert text(rest) == "beta gamma delta "


def metric(fc: Running, name: str) -> float:
    """The sum of a family's unlabelled samples on the function's /spillway/metrics."""
    _, _, body = http("GET", f"{fc.url}/spillway/metrics")
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines() if line.startswith(name + " ")
    )


def test_a_streams_tokens_and_first_token_time_are_counted(fc: Running) -> None:
    """One event per token (what vLLM's and TensorRT-LLM's backends stream), whatever pieces the
    sidecar's chunks cut them into; the time to the first event, once per stream."""
    events, firsts = (
        metric(fc, "spillway_function_stream_events_total"),
        metric(fc, "spillway_function_stream_first_event_seconds_count"),
    )
    with EventStream(stream_url(fc), prompt(5, delay_ms=5)) as stream:
        assert len(stream.rest()) == 5
    wait_until(
        lambda: metric(fc, "spillway_function_stream_events_total") == events + 5, 10, "5 events counted"
    )
    assert metric(fc, "spillway_function_stream_first_event_seconds_count") == firsts + 1


def test_generate_answers_the_whole_generation_in_one_answer(fc: Running) -> None:
    status, headers, body = http("POST", f"{fc.url}/v2/models/tokens/generate", prompt(6, stream=False))
    assert status == 200, body
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["text_output"] == "alpha beta gamma delta alpha beta "


def test_a_bad_prompt_gets_triton_s_error_as_a_client_error(fc: Running) -> None:
    body = json.dumps({"text_input": WORDS, "max_tokens": "many"}).encode()
    with EventStream(stream_url(fc), body) as events:
        assert events.status == 400
        assert "error" in json.loads(events.response.read())


def test_a_client_that_leaves_mid_stream_is_counted_and_the_function_serves_on(fc: Running) -> None:
    before = served(fc, "generate")
    with EventStream(stream_url(fc), prompt(400, delay_ms=20)) as events:
        assert events.next() is not None
    wait_until(lambda: served(fc, "generate") == before + 1, 30, "the cut stream counted")
    with EventStream(stream_url(fc), prompt(3)) as events:
        assert text(events.rest()) == "alpha beta gamma "


def test_a_client_that_stops_reading_is_let_go_and_holds_no_generation(fc: Running) -> None:
    """The attack: ask for a long generation (16 MB of events) and read none of it. Once the
    socket's buffers are full the function waits the stall bound for the client to read, then
    closes the connection and ends the stream; another client is served meanwhile."""
    before = served(fc, "generate")
    host, port = fc.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"text_input": "x" * 8000, "max_tokens": 2000}).encode()
    with socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, int(port)))
        head = f"POST /v2/models/tokens/generate_stream HTTP/1.1\r\nHost: {host}\r\n"
        stalled.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        with EventStream(stream_url(fc), prompt(3)) as events:
            assert text(events.rest()) == "alpha beta gamma "
        wait_until(lambda: served(fc, "generate") >= before + 2, 30, "the stalled stream ended")
        stalled.settimeout(30)
        received = 0
        while chunk := stalled.recv(1 << 16):
            received += len(chunk)
    assert received < 2000 * 8000, "the connection was closed before the generation was sent"


def test_a_sidecar_that_dies_mid_stream_ends_it_with_an_error_event(fc: Running, hold: Path) -> None:
    with EventStream(stream_url(fc), prompt(4)) as events:
        assert events.next() is not None
        os.kill(fc.triton_pid(), signal.SIGKILL)
        rest = events.rest()
    assert rest and "error" in rest[-1], rest
    assert "sidecar" in str(rest[-1]["error"])
    hold.unlink()
    wait_until(
        lambda: http("POST", f"{fc.url}/v2/models/tokens/generate", prompt(2, stream=False))[0] == 200,
        60,
        "the sidecar back",
    )


@pytest.fixture(scope="module")
def lam(repo: Path) -> Iterator[Running]:
    with lambda_emulator(repo, repo.parent, SPILLWAY_MODELS="tokens") as running:
        yield running


def test_lambda_invoke_answers_a_streamed_generation_whole(lam: Running) -> None:
    event = http_event("POST", "/v2/models/tokens/generate_stream", prompt(3, delay_ms=10))
    result = invoke(lam, event)
    assert result["statusCode"] == 200, result
    assert result["headers"]["content-type"].startswith("text/event-stream")
    events = [json.loads(line[5:]) for line in result["body"].splitlines() if line.startswith("data:")]
    assert text(events) == "alpha beta gamma "


def test_lambda_invoke_answers_generate(lam: Running) -> None:
    result = invoke(lam, http_event("POST", "/v2/models/tokens/generate", prompt(2, stream=False)))
    assert result["statusCode"] == 200, result
    assert json.loads(result["body"])["text_output"] == "alpha beta "
