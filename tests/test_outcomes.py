"""Outcomes from the route's http-logger: they close the books, open breakers and teach the gateway
the cluster's answer time; only APISIX may post them, and nothing it posts can grow without bound."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

import pytest

from functions.sidecar import free_port
from gateway_plugin import outcome_listener
from gateway_plugin.app import RunnerApp
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.routing import outcomes
from gateway_plugin.routing.policy import BreakerState
from gateway_plugin.routing.target_header import target_value
from tests.support import http

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
AWS = target_value("aws", TOKEN)


def config(port: int) -> SpillwayConfig:
    return SpillwayConfig.model_validate(
        {
            "targets": [
                {"name": "aws", "kind": "http", "url": "https://fn.example", "signing_key_env": None}
            ],
            "breaker": {"consecutive_failures": 3},
            "metrics": {"listen": None},
            "outcomes": {"listen": f"127.0.0.1:{port}"},
        }
    )


def post(port: int, body: Any, auth: str | None = None) -> tuple[int, bytes]:
    headers = {"authorization": auth if auth is not None else outcomes.auth_header(TOKEN)}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, answer = http("POST", f"http://127.0.0.1:{port}/spillway/outcomes", raw, headers)
    return status, answer


def test_a_target_answering_5xx_opens_its_breaker_and_local_times_feed_the_estimate() -> None:
    port = free_port()

    async def go() -> tuple[BreakerState, float, int]:
        app = RunnerApp(config(port))
        app.start()
        try:
            failing = [{"target": AWS, "status": "502", "upstream_status": "500", "instance": "i-1"}] * 3
            local = [
                {
                    "target": "local",
                    "upstream_status": "200",
                    "upstream_s": "0.300",
                    "uri": "/v2/models/m/infer",
                }
            ]
            for batch in (failing, local):
                status, _ = await asyncio.to_thread(post, port, batch)
                assert status == 204
            await asyncio.sleep(0)  # the batch was handed to this loop before the 204 went out
            load = app.state.snapshot(None, "m").local[""]
            breaker = app.state.breakers["aws"].current(app.state.clock())
            return breaker, load.observed_ms, app.state.pools["aws"].warm(app.state.clock())
        finally:
            app.close()

    breaker, observed_ms, warm = asyncio.run(go())
    assert breaker == BreakerState.OPEN
    assert observed_ms == 300.0
    assert warm == 1


def test_only_apisix_may_post_and_bad_batches_are_refused_with_the_reason() -> None:
    port = free_port()

    async def go() -> list[tuple[int, bytes]]:
        app = RunnerApp(config(port))
        app.start()
        try:
            return [
                await asyncio.to_thread(post, port, [{"target": AWS, "upstream_status": "500"}], ""),
                await asyncio.to_thread(
                    post, port, [{"target": AWS, "upstream_status": "500"}], "Spillway 0"
                ),
                await asyncio.to_thread(post, port, b"[{"),
                await asyncio.to_thread(post, port, [{"status": "not a number"}]),
                await asyncio.to_thread(post, port, [{}] * (outcomes.MAX_ENTRIES + 1)),
            ]
        finally:
            app.close()

    answers = asyncio.run(go())
    assert [status for status, _ in answers] == [401, 401, 400, 400, 400]
    assert all(b"error" in body for _, body in answers)


def test_an_answer_the_gateway_gave_itself_closes_no_books() -> None:
    """A shed request never reached an upstream: no upstream status, no cloud value (the runner sets
    none when it sheds). A request APISIX's aws-lambda plugin served has the runner's cloud value
    and the function's status, but no nginx upstream."""
    app = RunnerApp(config(free_port()))
    book = app.state.tenants.book("t")
    book.in_flight.add(app.state.clock())
    app.state.outstanding["aws"].add(app.state.clock())
    outcomes.apply(app.state, [outcomes.Outcome(target="aws", status=503, tenant="t")])
    assert book.in_flight.count(app.state.clock()) == 1, "a forged value closes nothing"
    outcomes.apply(app.state, [outcomes.Outcome(target=AWS, status=200, instance="fn-9")])
    assert app.state.outstanding["aws"].count(app.state.clock()) == 0
    assert app.state.pools["aws"].warm(app.state.clock()) == 1


def test_one_entry_a_client_made_too_long_costs_only_that_entry() -> None:
    """A client chooses the URI and the tenant header; one request of its own must not make the
    runner refuse the whole batch, and with it every other request's outcome."""
    port = free_port()
    failing = {"target": AWS, "status": "502", "upstream_status": "500", "instance": "i-1"}
    hostile = {**failing, "uri": "/v2/" + "a" * 20_000, "worker": "²" * 20}

    async def go() -> tuple[int, BreakerState]:
        app = RunnerApp(config(port))
        app.start()
        try:
            status, _ = await asyncio.to_thread(post, port, [failing, hostile, failing, failing])
            await asyncio.sleep(0)
            return status, app.state.breakers["aws"].current(app.state.clock())
        finally:
            app.close()

    status, breaker = asyncio.run(go())
    assert status == 204
    assert breaker == BreakerState.OPEN, "the three well-formed failures reached the breaker"


def test_a_refused_post_ends_its_connection_so_its_unread_body_is_never_taken_for_a_request() -> None:
    port = free_port()
    inner = b"POST /spillway/nowhere HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
    outer = (
        b"POST /spillway/outcomes HTTP/1.1\r\nhost: x\r\nauthorization: wrong\r\n"
        + f"content-length: {len(inner)}\r\n\r\n".encode()
        + inner
    )

    async def go() -> bytes:
        app = RunnerApp(config(port))
        app.start()
        try:
            return await asyncio.to_thread(exchange, port, outer)
        finally:
            app.close()

    answer = asyncio.run(go())
    assert answer.startswith(b"HTTP/1.0 401") or answer.startswith(b"HTTP/1.1 401")
    assert answer.count(b"HTTP/1.") == 1, answer


def exchange(port: int, data: bytes) -> bytes:
    """Everything the server sends until it closes (or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
        return received


def test_connections_beyond_the_bound_are_closed_at_once_and_the_endpoint_keeps_serving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outcome_listener, "MAX_CONNECTIONS", 4)
    port = free_port()

    async def go() -> tuple[bytes, int]:
        app = RunnerApp(config(port))
        app.start()
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
        try:
            await asyncio.sleep(0.2)  # the four are taken by their threads
            body = json.dumps([{"target": "local", "upstream_status": "200"}]).encode()
            request = (
                b"POST /spillway/outcomes HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                + f"authorization: {outcomes.auth_header(TOKEN)}\r\n".encode()
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            refused = await asyncio.to_thread(exchange, port, request)
        finally:
            for sock in idle:
                sock.close()
        await asyncio.sleep(0.2)
        status, _ = await asyncio.to_thread(post, port, [{"target": "local", "upstream_status": "200"}])
        app.close()
        return refused, status

    refused, status = asyncio.run(go())
    assert refused == b"", "closed without an answer"
    assert status == 204
