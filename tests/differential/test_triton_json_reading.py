"""How a real Triton reads the JSON bodies that content checks refuse or leave unread, so the
gateway's rules (content/checks.py, spillway/content.lua) rest on what the model server does and
a change in Triton shows here: of a key written twice in one object it reads the first (where
Python's json and cjson read the last), and a binary-tensor body must end where its inputs'
``binary_data_size`` say (the sum content checks compare the body against)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import pytest

from functions.sidecar import Sidecar, SidecarOptions
from testing.function import model_repository
from testing.http import http

pytestmark = pytest.mark.integration

INFER = "/v2/models/add_sub/infer"


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = model_repository(tmp_path_factory.mktemp("triton-json"), "add_sub")
    server = Sidecar(SidecarOptions(repo, ("add_sub",), 60, log_prefix="[triton] "))
    server.start()
    try:
        server.wait_ready(60)
        yield f"http://127.0.0.1:{server.http_port}"
    finally:
        server.stop()


def _inputs(first: list[float], second: list[float]) -> str:
    return json.dumps(
        [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": first},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": second},
        ]
    )


def _output0(url: str, body: bytes, **headers: str) -> list[float]:
    status, _, answer = http("POST", url + INFER, body, {"content-type": "application/json", **headers})
    assert status == 200, answer[:300]
    outputs = {o["name"]: o["data"] for o in json.loads(answer)["outputs"]}
    return [float(x) for x in outputs["OUTPUT0"]]


def test_triton_reads_the_first_of_two_inputs_where_python_reads_the_last(triton: str) -> None:
    body = f'{{"inputs": {_inputs([1, 2, 3, 4], [10, 20, 30, 40])}, "inputs": {_inputs([0] * 4, [0] * 4)}}}'
    assert json.loads(body)["inputs"][0]["data"] == [0, 0, 0, 0]  # Python's reading: the last
    assert _output0(triton, body.encode()) == [11, 22, 33, 44]
    # The first spelt as an escape: the same key to Triton, which still reads it first.
    escaped = body.replace('"inputs"', '"\\u0069nputs"', 1)
    assert _output0(triton, escaped.encode()) == [11, 22, 33, 44]


def test_triton_reads_the_first_of_two_data_in_one_input(triton: str) -> None:
    body = _inputs([1, 2, 3, 4], [10, 20, 30, 40]).replace(
        '"data": [1, 2, 3, 4]', '"data": [1, 2, 3, 4], "data": [0, 0, 0, 0]'
    )
    assert _output0(triton, b'{"inputs": ' + body.encode() + b"}") == [11, 22, 33, 44]


def test_triton_takes_a_binary_body_only_when_it_ends_where_its_inputs_say(triton: str) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 16},
                },
                {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [10, 20, 30, 40]},
            ]
        }
    ).encode()
    tensor = struct.pack("<4f", 1, 2, 3, 4)
    length = {"inference-header-content-length": str(len(header))}
    assert _output0(triton, header + tensor, **length) == [11, 22, 33, 44]
    for body in (header + tensor + b"4111111111111111", header + tensor[:-1]):
        status, _, answer = http("POST", triton + INFER, body, {"content-type": "application/json", **length})
        assert status == 400, (status, answer[:300])
