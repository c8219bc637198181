"""The function's core with its I/O passed in: what reaches the sidecar, and what a broken backend
answer does. (The real sidecar, HTTP server and Triton are in test_function_fc/hostile.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import cast

from functions.core import FunctionCore
from functions.http_types import Request
from functions.settings import FunctionSettings
from functions.sidecar import Sidecar, SidecarState
from functions.sidecar_client import Headers, UpstreamResponse
from testing.paths import EXAMPLE_MODELS


class FakeSidecar:
    def __init__(self) -> None:
        self.state = SidecarState.READY
        self.http_port = 1
        self.ready_at: float | None = 0.0
        self.restarts = 0
        self.broken: list[str] = []

    def report_broken(self, reason: str) -> None:
        self.broken.append(reason)
        self.state = SidecarState.DOWN


class FakeUpstream:
    """Answers every request with one canned response and remembers what it was sent."""

    def __init__(self, status: int, body: bytes) -> None:
        self.answer = UpstreamResponse(status, [(b"content-type", b"application/json")], body)
        self.sent: list[tuple[str, str, bytes]] = []

    async def request(
        self, method: str, target: str, headers: Headers, body: bytes, timeout: float | None
    ) -> UpstreamResponse:
        self.sent.append((method, target, body))
        return self.answer

    def close(self) -> None:
        pass


class NoProber:
    async def ready_models(self, models: Iterable[str]) -> tuple[str, ...]:
        return ()

    async def probe_models(self, models: Iterable[str]) -> tuple[str, ...]:
        return ()

    async def close(self) -> None:
        pass


def core(upstream: FakeUpstream, sidecar: FakeSidecar) -> FunctionCore:
    settings = FunctionSettings(model_repository=EXAMPLE_MODELS, models=("add_sub",))
    return FunctionCore(settings, cast(Sidecar, sidecar), upstream, NoProber())


def test_the_sidecar_gets_the_normalised_path_and_the_query() -> None:
    upstream = FakeUpstream(200, b"{}")
    answer = asyncio.run(
        core(upstream, FakeSidecar()).handle(Request("POST", "//v2/./models/m/infer?x=1", {}))
    )
    assert answer.status == 200
    assert upstream.sent == [("POST", "/v2/models/m/infer?x=1", b"")]


def test_administration_never_reaches_the_sidecar() -> None:
    upstream = FakeUpstream(200, b"{}")
    answer = asyncio.run(core(upstream, FakeSidecar()).handle(Request("POST", "/v2/repository/index", {})))
    assert answer.status == 403 and upstream.sent == []


def test_a_dead_backend_stub_takes_the_sidecar_down_and_the_client_gets_503() -> None:
    broken = json.dumps(
        {
            "error": "Failed to process the request(s) for model instance 'm_0', "
            "message: Stub process 'm_0' is not healthy."
        }
    ).encode()
    sidecar = FakeSidecar()
    fn = core(FakeUpstream(500, broken), sidecar)
    first = asyncio.run(fn.handle(Request("POST", "/v2/models/m/infer", {})))
    assert first.status == 503 and first.header("retry-after") == "1"
    assert "restarting" in json.loads(first.body)["error"]
    assert len(sidecar.broken) == 1 and sidecar.state is SidecarState.DOWN
    second = asyncio.run(fn.handle(Request("POST", "/v2/models/m/infer", {})))
    assert second.status == 503, "no request reaches a sidecar that is down"
