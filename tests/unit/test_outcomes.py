"""Outcomes from the route's http-logger: they close the books, open breakers and teach the gateway
the cluster's answer time; only APISIX may post them, and nothing it posts can grow without bound."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtools.apisix_peer import ApisixPeer, PeerRequest
from functions.sidecar import free_port
from gateway_plugin import outcome_listener
from gateway_plugin.app import RunnerApp
from gateway_plugin.books import outcomes
from gateway_plugin.books.target_header import target_value
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.policy.model import Decision, Reason
from gateway_plugin.policy.snapshot import BreakerState
from gateway_plugin.policy.tenants import tenant_key
from testing.http import http, wait_until
from tests.unit.test_runner_hostile import SPILL, runner_process

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
                await asyncio.to_thread(post, port, [1, "not an entry"]),
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


def free_slots(app: RunnerApp) -> int:
    """Connections the outcome endpoint may still take: its semaphore's count (there is no public view)."""
    assert app.outcome_listener is not None
    return app.outcome_listener._server._slots._value


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
            await asyncio.to_thread(wait_until, lambda: free_slots(app) == 0, 10, "the four taken")
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
        await asyncio.to_thread(wait_until, lambda: free_slots(app) == 4, 10, "the four slots freed")
        status, _ = await asyncio.to_thread(post, port, [{"target": "local", "upstream_status": "200"}])
        app.close()
        return refused, status

    refused, status = asyncio.run(go())
    assert refused == b"", "closed without an answer"
    assert status == 204


def tenant_config(port: int) -> SpillwayConfig:
    made = config(port).model_dump()
    made["tenants"] = {"default": {"concurrency": 5}}
    made["breaker"] = {"consecutive_failures": 1, "cooldown_s": 600}
    return SpillwayConfig.model_validate(made)


def test_a_malformed_field_reads_as_absent_and_the_rest_of_its_entry_still_closes_the_books() -> None:
    """A client sets the worker and tenant headers, the URI, and through them fields of its own
    outcome: one field over its bound or of the wrong kind costs that field, counted, never the
    entry, so the cloud request's in-flight count, its tenant's and the breaker still learn."""
    state = RunnerApp(tenant_config(free_port())).state
    long_tenant = "t" * 10_000
    decision = Decision("aws", Reason.OVERFLOW_WARM, tenant=tenant_key(long_tenant))
    state.commit(decision, None)
    hostile = {
        "target": AWS,
        "status": 503,
        "upstream_status": "503",
        "upstream_s": {"not": "a number"},
        "instance": "i" * 300,
        "cold": "1" * 30,
        "tenant": long_tenant,
        "uri": "/v2/models/" + "m" * 20_000,
        "worker": "123456789",
    }
    batch = outcomes.read_entries([hostile])
    assert len(batch.entries) == 1 and batch.refused == 0
    assert batch.invalid == {"upstream_s": 1, "instance": 1, "cold": 1, "uri": 1, "worker": 1}
    outcomes.apply(state, batch.entries)
    now = state.clock()
    assert state.outstanding["aws"].count(now) == 0
    book = state.tenants.get(tenant_key(long_tenant))
    assert book is not None and book.in_flight.count(now) == 0
    assert state.breakers["aws"].current(now) is BreakerState.OPEN
    assert state.metrics.outcome_fields_invalid.labels("worker")._value.get() == 1
    assert state.metrics.outcome_fields_invalid.labels("tenant")._value.get() == 0


def test_bytes_that_are_not_utf8_cost_only_the_fields_that_carry_them() -> None:
    """nginx passes a header's bytes as sent and http-logger writes them into its JSON as they
    are: one request with such a tenant or URI must not make its whole batch unreadable. The
    tenant is keyed by the hash of the bytes it sent, as the fast path's plugin keys it."""
    state = RunnerApp(tenant_config(free_port())).state
    sent = b"caf\xe9-\xff"
    tenant = tenant_key(sent.decode("utf-8", "surrogateescape"))
    assert tenant == "sha256:" + hashlib.sha256(sent).hexdigest()
    state.commit(Decision("aws", Reason.OVERFLOW_WARM, tenant=tenant), None)
    body = (
        b'[{"target":"' + AWS.encode() + b'","status":502,"upstream_status":"502",'
        b'"tenant":"' + sent + b'","uri":"/v2/models/\xff/infer"},'
        b'{"target":"local","upstream_status":"200","upstream_s":"0.2","uri":"/v2/models/m/infer"}]'
    )
    batch = outcomes.read_entries(outcomes.entries_of(body))
    assert len(batch.entries) == 2 and batch.invalid == {"uri": 1}
    outcomes.apply(state, batch.entries)
    now = state.clock()
    assert state.outstanding["aws"].count(now) == 0
    book = state.tenants.get(tenant)
    assert book is not None and book.in_flight.count(now) == 0


def test_what_the_workers_parent_forwards_keeps_the_count_of_malformed_fields() -> None:
    """Several workers: the parent reads the batch and forwards each entry to its worker, which
    counts the fields the parent found malformed."""
    batch = outcomes.read_entries([{"target": "local", "worker": "123456789"}])
    forwarded = [entry.model_dump(exclude_none=True) for entry in batch.entries]
    again = outcomes.read_entries(forwarded)
    state = RunnerApp(tenant_config(free_port())).state
    outcomes.apply(state, again.entries)
    assert again.invalid == {} and state.metrics.outcome_fields_invalid.labels("worker")._value.get() == 1


def test_malformed_fields_are_logged_at_most_once_in_a_while(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    entry = {"target": "local", "upstream_status": "200", "worker": "123456789", "tenant": "x" * 9000}

    async def go() -> list[int]:
        app = RunnerApp(tenant_config(port))
        app.start()
        try:
            return [(await asyncio.to_thread(post, port, [entry] * 3))[0] for _ in range(5)]
        finally:
            app.close()

    with caplog.at_level("WARNING", "spillway.outcomes"):
        statuses = asyncio.run(go())
    assert statuses == [204] * 5
    said = [r.message for r in caplog.records if "worker" in r.message]
    assert len(said) == 1, said
    assert "123456789" not in said[0] and "x" * 100 not in said[0], "a client's values stay out of the log"


def test_through_a_real_runner_a_nine_character_worker_and_a_long_tenant_still_close_the_books(
    tmp_path: Path,
) -> None:
    """A runner process as APISIX starts it sends a request with a 10,000-character tenant to aws;
    http-logger's entry for it carries the client's 9-character X-Spillway-Worker. The entry still
    closes the books: aws has nothing in flight, its 503 opened the breaker, and the tenant, whose
    quota allows one request at a time, gets through again."""
    metrics_port, outcomes_port = free_port(), free_port()
    spec = {
        "targets": [{"name": "aws", "kind": "http", "url": "https://fn.example", "signing_key_env": None}],
        "rules": [{"name": "out", "match": {"uri": "^/v2/"}, "action": "target", "targets": ["aws"]}],
        "residency": {"unclassified_may_leave": True},
        "tenants": {"default": {"concurrency": 1}},
        "breaker": {"consecutive_failures": 1, "cooldown_s": 600},
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        "outcomes": {"listen": f"127.0.0.1:{outcomes_port}"},
    }
    tenant = "t" * 10_000
    request = PeerRequest("POST", "/v2/models/m/infer", headers=[("x-tenant", tenant)])

    async def decide(sock: Path) -> str:
        peer = ApisixPeer(sock)
        try:
            outcome = await peer.request(SPILL, request)
        finally:
            await peer.close()
        if outcome.stop is not None:
            return f"stop {outcome.stop.status}"
        assert outcome.rewrite is not None, outcome
        return dict(outcome.rewrite.headers)["x-spillway-target"]

    def metric(name: str) -> float:
        text = http("GET", f"http://127.0.0.1:{metrics_port}/metrics")[2].decode()
        found = re.search(rf'^{name}{{target="aws"}} (\S+)$', text, re.M)
        return float(found.group(1)) if found else -1.0

    def listening() -> bool:
        try:
            return post(outcomes_port, [])[0] == 204
        except OSError:
            return False

    with runner_process(tmp_path, spec) as (sock, _):
        wait_until(listening, 10, "the runner's outcome endpoint")
        assert asyncio.run(decide(sock)) == AWS
        assert asyncio.run(decide(sock)) == "stop 429", "the tenant's one slot is taken"
        wait_until(lambda: metric("spillway_target_in_flight") == 1, 10, "aws in flight")
        entry = {
            "target": AWS,
            "status": 503,
            "upstream_status": "503",
            "upstream_s": "0.050",
            "request_s": "0.051",
            "tenant": tenant,
            "uri": "/v2/models/m/infer",
            "worker": "123456789",
        }
        assert post(outcomes_port, [entry])[0] == 204
        wait_until(lambda: metric("spillway_target_in_flight") == 0, 10, "aws's books closed")
        wait_until(lambda: metric("spillway_breaker_open") == 1, 10, "the 503 counted")
        assert asyncio.run(decide(sock)) != "stop 429", "the tenant's slot was given back"


def test_a_large_batch_is_applied_a_slice_at_a_time_with_the_loop_serving_between_slices() -> None:
    """A thousand entries applied in one callback would hold every request the loop has to answer;
    a slice at a time, in the order they came, the next batch behind the last, none left out."""
    applied: list[list[str | None]] = []
    served_after: list[int] = []

    async def go() -> None:
        sliced = outcomes.SlicedApply(lambda entries: applied.append([e.tenant for e in entries]), size=64)
        batch = [outcomes.Outcome(tenant=str(i)) for i in range(150)]
        sliced(batch[:100])
        assert applied == [[str(i) for i in range(64)]], "the first slice at once"
        asyncio.get_running_loop().call_soon(lambda: served_after.append(len(applied)))
        sliced(batch[100:])
        for _ in range(2):
            await asyncio.sleep(0)
        assert not sliced.pending

    asyncio.run(go())
    assert [len(s) for s in applied] == [64, 64, 22]
    assert [t for s in applied for t in s] == [str(i) for i in range(150)]
    assert served_after == [2], "another callback ran between the slices"


_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2000),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.text(min_size=199, max_size=202),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
_ITEMS = st.one_of(
    st.dictionaries(st.sampled_from([*outcomes.FIELDS, "invalid", "other"]), _FIELD_VALUES, max_size=6),
    st.integers(),
    st.text(max_size=5),
)


@settings(max_examples=200, deadline=None)
@given(raw=st.lists(_ITEMS, max_size=40), size=st.integers(1, 41))
def test_entries_checked_a_slice_at_a_time_read_as_the_batch_read_whole(raw: list[Any], size: int) -> None:
    """The listener's thread only reads a batch's JSON; its entries are checked on the loop, a
    slice at a time. Sliced, they read as the whole batch does: the same entries in the same order,
    the same entries refused, the same malformed fields counted."""
    whole = outcomes.read_entries(raw)
    parts = [outcomes.read_entries(raw[i : i + size]) for i in range(0, len(raw), size)]
    assert [e for p in parts for e in p.entries] == whole.entries
    assert sum(p.refused for p in parts) == whole.refused
    summed: dict[str, int] = {}
    for part in parts:
        for name, count in part.invalid.items():
            summed[name] = summed.get(name, 0) + count
    assert summed == whole.invalid


def test_the_listener_hands_the_loop_a_batch_unchecked_and_the_loop_checks_it_in_slices() -> None:
    """What the loop is given is the batch's JSON values; a batch of thousands is checked and applied
    64 entries a turn, the hostile entries among them read field by field as before."""
    port = free_port()
    count = 3 * outcomes.SLICE + 5
    hostile = {"target": AWS, "status": 502, "upstream_status": "500", "worker": "\u00b2" * 20}

    async def go() -> tuple[list[list[object]], BreakerState]:
        app = RunnerApp(config(port))
        given: list[list[object]] = []
        take = app.outcomes.__call__

        def spy(entries: list[object]) -> None:
            given.append(entries)
            take(entries)

        app.outcomes = spy  # type: ignore[assignment,method-assign]
        app.start()
        try:
            status, _ = await asyncio.to_thread(post, port, [hostile] * count)
            assert status == 204
            for _ in range(4):
                await asyncio.sleep(0)
            return given, app.state.breakers["aws"].current(app.state.clock())
        finally:
            app.close()

    given, breaker = asyncio.run(go())
    assert [len(batch) for batch in given] == [count]
    assert all(isinstance(entry, dict) for entry in given[0]), "JSON values, not yet outcomes"
    assert breaker == BreakerState.OPEN, "the 502s, each with a malformed worker, reached the breaker"


def test_entries_waiting_past_the_bound_are_applied_at_once_and_none_is_lost() -> None:
    applied: list[str | None] = []

    async def go() -> None:
        sliced = outcomes.SlicedApply(lambda entries: applied.extend(e.tenant for e in entries), 10, 100)
        sliced([outcomes.Outcome(tenant=str(i)) for i in range(80)])
        assert len(applied) == 10
        sliced([outcomes.Outcome(tenant=str(i)) for i in range(80, 160)])
        assert applied == [str(i) for i in range(160)] and not sliced.pending
        await asyncio.sleep(0)  # the turn still scheduled finds nothing left
        assert len(applied) == 160

    asyncio.run(go())


def test_a_batch_posted_through_the_listener_closes_every_request_it_names() -> None:
    port = free_port()
    count = 3 * outcomes.SLICE + 5

    async def go() -> tuple[int, int]:
        app = RunnerApp(config(port))
        app.start()
        try:
            for _ in range(count):
                app.state.commit(Decision("aws", Reason.OVERFLOW_WARM), None)
            sent = app.state.outstanding["aws"].count(app.state.clock())
            answer = [{"target": AWS, "upstream_status": "200"}] * count
            status, _ = await asyncio.to_thread(post, port, answer)
            assert status == 204
            for _ in range(count // outcomes.SLICE):  # the slices left, if the loop has not run them
                await asyncio.sleep(0)
            assert not app.outcomes.pending
            return sent, app.state.outstanding["aws"].count(app.state.clock())
        finally:
            app.close()

    assert asyncio.run(go()) == (count, 0)
