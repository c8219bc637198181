"""The fuzz campaigns of ``bench/fuzz.py``, bounded for the normal test run.

Same generators and invariants as ``python bench/fuzz.py runner`` and ``python bench/fuzz.py http``,
with fixed seeds: 20,000 frames against a real ``python -m gateway_plugin run`` over its Unix
socket, and 2,000 requests against ``functions.http_server`` with an echo handler. Nothing here
measures time; the campaigns' own timeouts only end waits for answers that never come.

Three findings of the full campaign are pinned by their own tests below: an answer to HEAD
carries no body, an interim ``100 Continue`` never overtakes earlier answers, and a call queued
behind one that waits on ExtraInfo does not stop its answers being read.
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from functions import http_server
from testing.paths import ROOT


def _load_fuzz() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spillway_bench_fuzz", ROOT / "bench" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzz()


def _explain(summary: dict[str, object]) -> str:
    return "\n".join(fuzz.iter_violations(summary))


def test_the_runner_survives_a_short_fuzz_campaign(tmp_path: Path) -> None:
    summary = fuzz.run_runner_campaign(
        fuzz.RunnerOptions(
            frames=20_000,
            seed=20_241,
            probe_every=2_000,
            progress=False,
            artifacts=tmp_path / "artifacts",
            workdir=tmp_path / "runner",
        )
    )
    assert summary["violations"]["count"] == 0, _explain(summary)
    assert summary["frames_sent"] >= 20_000
    assert summary["runner"]["exit_code"] == 0
    assert summary["probes"].get("ok", 0) >= 2 and not summary["probes"].get("failed")
    lanes = summary["frames_by_lane"]
    assert lanes["wellformed"] and lanes["mutated"] and lanes["chaos"]
    answers = summary["answers_by_kind"]
    # ExtraInfo round trips are covered by test_runner_socket (the shipped plugins ask none here).
    for kind in ("prepare_conf", "req_call:rewrite", "req_call:stop", "resp_call"):
        assert answers.get(kind), f"no {kind} answers: the generator no longer reaches that path"
    decisions = summary["decisions"]
    assert decisions.get("local") and decisions.get("aws", 0) + decisions.get("fc", 0) > 0, decisions
    assert summary["stats"]["residency_checked"] > 0
    assert summary["errors_by_kind"].get("BAD_REQUEST") and summary["errors_by_kind"].get(
        "CONF_TOKEN_NOT_FOUND"
    )


def test_the_http_server_survives_a_short_fuzz_campaign(tmp_path: Path) -> None:
    summary = fuzz.run_http_campaign(
        fuzz.HttpOptions(
            requests=2_000,
            seed=20_242,
            storm_every=100,
            progress=False,
            artifacts=tmp_path / "artifacts",
            workdir=tmp_path / "http",
        )
    )
    assert summary["violations"]["count"] == 0, _explain(summary)
    assert summary["requests_sent"] >= 2_000
    assert summary["server"]["exit_code"] == 0
    statuses = summary["statuses"]
    for status in ("200", "400", "503"):
        assert statuses.get(status), f"no {status} answers in {statuses}"
    assert summary["answers"].get("handler") and summary["answers"].get("refusal")


def test_the_generators_are_deterministic_for_a_seed() -> None:
    def frames(seed: str) -> list[bytes]:
        gen = fuzz.ProtocolGen(random.Random(seed), {"aws": "aws:" + "0" * 32, "fc": "fc:" + "1" * 32})
        calls = [gen.prepare(), gen.req_call(7), gen.resp_call(7)]
        return [c.payload for c in calls] + [gen.mutate(c.ty, c.payload)[1] for c in calls]

    def scripts(seed: str) -> list[bytes]:
        options = fuzz.HttpOptions()
        gen = fuzz.HttpGen(random.Random(seed), options, fuzz.FUZZ_LIMITS, fuzz.FUZZ_MAX_BODY)
        return [b"".join(piece for piece, _ in gen.script().pieces) for _ in range(20)]

    assert frames("a") == frames("a") != frames("b")
    assert scripts("a") == scripts("a") != scripts("b")


@pytest.mark.parametrize(
    ("headers", "leaves"),
    [
        ([("x-data-classification", "public")], True),
        ([("X-Data-Classification", " PUBLIC ")], True),
        ([], False),
        ([("x-data-classification", None)], False),
        ([("x-data-classification", "confidential")], False),
        ([("x-data-classification", "public"), ("x-data-classification", "public")], False),
        ([("x-data-classification", "public"), ("x-data-classification", None)], True),
        ([("x-data-classification ", "public")], False),
        ([("x-data-classification", "publ\u0456c")], False),
    ],
)
def test_the_residency_oracle(headers: list[tuple[str, str | None]], leaves: bool) -> None:
    assert fuzz.may_leave(headers) is leaves


async def _echo_exchange(data: bytes) -> bytes:
    """``data`` to ``http_server`` with the fuzz echo handler; everything it sends until it closes."""
    server = await http_server.serve(fuzz.echo_handler, "127.0.0.1", 0, 1024, fuzz.FUZZ_LIMITS)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(data)
        received = b""
        async with asyncio.timeout(30):
            while chunk := await reader.read(65536):
                received += chunk
        writer.close()
        return received
    finally:
        server.close()


def _problems(received: bytes, head_first: bool) -> list[str]:
    stream = fuzz.AnswerStream()
    stream.feed(received)
    stream.eof = True
    problems = []
    head = head_first
    while True:
        answer, problem = stream.next(head)
        if problem is not None:
            problems.append(problem)
        if answer is None:
            return problems
        head = False


def test_an_answer_to_head_carries_no_body() -> None:
    sent = b"HEAD /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    received = asyncio.run(_echo_exchange(sent))
    assert _problems(received, head_first=True) == [], received


def test_an_interim_100_does_not_overtake_earlier_answers() -> None:
    sent = (
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /b HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n"
        b"Connection: close\r\n\r\nabc"
    )
    received = asyncio.run(_echo_exchange(sent))
    first = received.split(b"\r\n", 1)[0]
    assert first == b"HTTP/1.1 200 OK", received


def test_answers_to_questions_are_read_while_a_call_is_queued(tmp_path: Path) -> None:
    from gateway_plugin.protocol import encode, messages
    from gateway_plugin.protocol.frames import FrameType, frame
    from gateway_plugin.runner import ConnectionLimits, Runner, serve
    from testing.runner import test_plugins

    async def go() -> list[tuple[int, bytes]]:
        sock = tmp_path / "r.sock"
        server = await serve(Runner(test_plugins(), limits=ConnectionLimits(ask_timeout_s=0.5)), sock)
        reader, writer = await asyncio.open_unix_connection(str(sock))

        async def receive() -> tuple[int, bytes]:
            head = await reader.readexactly(4)
            return head[0], await reader.readexactly(int.from_bytes(head[1:], "big"))

        writer.write(frame(FrameType.PREPARE_CONF, encode.prepare_conf("k", [("echo-extra", "{}")])))
        token = messages.conf_token((await receive())[1])

        def call(call_id: int) -> bytes:
            payload = encode.req_call(call_id, token, 2, "/p", [], [], bytes([127, 0, 0, 1]))
            return frame(FrameType.HTTP_REQ_CALL, payload)

        writer.write(call(1) + call(2))  # the second waits in the runner's queue
        answers: list[tuple[int, bytes]] = []
        async with asyncio.timeout(30):
            while len(answers) < 2:
                ty, payload = await receive()
                if ty == FrameType.EXTRA_INFO:  # answered at once, as APISIX answers
                    kind, name = messages.extra_info_request(payload)
                    value = None if name == "not_set" else b"route-1" if kind == 1 else b"body"
                    writer.write(frame(FrameType.EXTRA_INFO, encode.extra_info_answer(value)))
                else:
                    answers.append((ty, payload))
        writer.close()
        server.close()
        return answers

    answers = asyncio.run(go())
    assert [ty for ty, _ in answers] == [FrameType.HTTP_REQ_CALL, FrameType.HTTP_REQ_CALL], answers
    for _, payload in answers:
        _, stop = messages.req_call_answer(payload)
        assert isinstance(stop, messages.Stop) and stop.body == b"route-1|None|body", stop
