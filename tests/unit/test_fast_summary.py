"""A fast-path worker's summary read part by part: what clients put in it (a path, a header, a
tenant name, bytes that are not UTF-8) costs at most the part that carries it, counted and said
once in a while, and the rest of the summary still feeds the books."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from functions.sidecar import free_port
from gateway_plugin.app import RunnerApp
from gateway_plugin.books import outcomes
from gateway_plugin.fast_path.book import apply_outcomes
from gateway_plugin.fast_path.summary import MAX_KEYS, FastOutcomes
from gateway_plugin.policy.snapshot import BreakerState
from gateway_plugin.policy.tenants import tenant_key
from gateway_plugin.signals.members import Counters
from testing.gateway import gateway_state
from tests.unit.test_fast_path_runner import TOKEN, _post, config


def test_a_malformed_part_of_a_summary_costs_only_itself_and_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An unreadable count drops its entry; a malformed cloud answer time, tenant spend, instance
    id or text of a request kept home reads as absent while the rest of its entry counts; a
    tenant name of any length is kept as its key. Each lost part is counted, said once."""
    state = gateway_state(config(breaker={"consecutive_failures": 3}))
    long = "t" * 5000
    summary = FastOutcomes.model_validate_json(
        json.dumps(
            {
                "decisions": {"local;local_ok": -1, "aws;overflow_cold": 3},
                "local_s": {"": [1, -1.0]},
                "cloud": {"aws": [0, 3, -0.3], "fc": [1, 2]},
                "instances": {"aws": {"i-1": False, "i" * 5000: True}},
                "tenants": {long: [1, 0.1], "t1": [2, "free"]},
                "residency": [{"path": "/" + "x" * 8000, "classification": "pii"}],
                "invalid": 0,
            }
        )
    )
    assert summary.invalid == 7
    assert summary.cloud == {"aws": (0, 3, 0.0), "fc": (1, 2, 0.0)}
    assert summary.tenants == {tenant_key(long): (1, 0.1), "t1": (2, 0.0)}
    assert summary.instances == {"aws": {"i-1": False}}
    assert [r.model_dump() for r in summary.residency] == [
        {"path": None, "model": None, "classification": "pii", "content": None}
    ]
    with caplog.at_level("WARNING", "spillway.fast_path"):
        apply_outcomes(state, summary)
        apply_outcomes(state, summary)
    assert state.breakers["aws"].current(state.clock()) is BreakerState.OPEN
    book = state.tenants.get("t1")
    assert book is not None and book.last_minute(state.wall()) == 4, "two summaries of 2 each"
    assert state.pools["aws"].warm(state.clock()) == 1
    assert state.metrics.fast_path_dropped._value.get() == 14
    said = [r.message for r in caplog.records if "malformed parts" in r.message]
    assert len(said) == 1 and "7 malformed" in said[0]
    assert not any(long in r.message for r in caplog.records)


def test_bytes_that_are_not_utf8_cost_only_the_part_that_carries_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """nginx hands the plugin a path and headers as their bytes were sent: a summary carrying a
    request kept home whose path is not UTF-8 still counts through the endpoint, and the path
    reaches the residency log with U+FFFD."""
    port = free_port()
    body = (
        b'{"cloud": {"aws": [0, 3, 0.3]}, "decisions": {"local;residency": 1},'
        b' "residency": [{"path": "/v2/models/m\xff/infer", "classification": "secr\xe9t"}]}'
    )

    async def go() -> tuple[int, BreakerState]:
        aws_only = [{"name": "aws", "kind": "http", "url": "https://fn.example"}]
        app = RunnerApp(config(port, targets=aws_only, breaker={"consecutive_failures": 3}))
        app.start()
        try:
            status, _ = await asyncio.to_thread(
                _post, port, "/spillway/fast-outcomes", body, outcomes.auth_header(TOKEN)
            )
            await asyncio.sleep(0)  # the summary was handed to this loop before the 204 went out
            return status, app.state.breakers["aws"].current(app.state.clock())
        finally:
            await app.aclose()

    with caplog.at_level("INFO", "spillway.residency"):
        status, breaker = asyncio.run(go())
    assert status == 204 and breaker is BreakerState.OPEN
    assert any("/v2/models/m\\ufffd/infer" in r.message for r in caplog.records)


def test_tenant_names_past_their_bound_cost_no_targets_answers() -> None:
    """Clients choose tenant names: a summary whose tenant-keyed maps hold more than their bound
    (1,000 each) loses only the entries past it, counted; aws's three failures in it still open
    its breaker, and the tenants within the bound are counted."""
    tenants = {"default": {"requests_per_minute": 1_000_000}}
    state = gateway_state(config(breaker={"consecutive_failures": 3}, tenants=tenants))
    names = [f"flood-{i}" for i in range(MAX_KEYS + 5)]
    summary = FastOutcomes.parse(
        json.dumps(
            {
                "tenants": {name: [1, 0.0] for name in names},
                "usage": {f"local\t{name}\tadd_sub": [1, 0.0] for name in names},
                "cloud": {"aws": [0, 3, 0.3]},
            }
        ).encode()
    )
    assert summary.invalid == 10
    assert summary.cloud == {"aws": (0, 3, 0.3)}
    assert list(summary.tenants) == names[:MAX_KEYS]
    apply_outcomes(state, summary)
    assert state.breakers["aws"].current(state.clock()) is BreakerState.OPEN
    book = state.tenants.get(names[0])
    assert book is not None and book.last_minute(state.wall()) == 1


def test_a_summary_adds_to_the_backlog_only_its_share_sent_since_the_last_scrape() -> None:
    """A worker's summary counts what it sent local over ``span_s``; a scrape in that span already
    saw the part before it (done or pending), so only the rest is backlog still unseen. Counting
    the whole lump made a slow-flushing node look saturated and shed what could not leave."""
    now = [100.0]
    state = gateway_state(config(), clock=lambda: now[0])
    state.load.observe([{"": Counters()}])
    now[0] = 100.5

    def sent_since_scrape() -> int:
        return state.load.snapshot(None)[""].sent_since_scrape

    apply_outcomes(state, FastOutcomes.model_validate({"sent_local": {"": 1000}, "span_s": 10.0}))
    assert sent_since_scrape() == 50, "0.5 s of the 10 s the summary spans came after the scrape"
    apply_outcomes(state, FastOutcomes.model_validate({"sent_local": {"": 7}, "span_s": 0.2}))
    assert sent_since_scrape() == 57, "a summary whose span began after the scrape counts whole"
    apply_outcomes(state, FastOutcomes.model_validate({"sent_local": {"": 3}}))
    assert sent_since_scrape() == 60, "a summary without its span (an older plugin) counts whole"
    state.load.observe([{"": Counters(pending=4)}])
    assert sent_since_scrape() == 0


def test_a_summary_counts_whole_before_any_scrape() -> None:
    state = gateway_state(config())
    apply_outcomes(state, FastOutcomes.model_validate({"sent_local": {"m": 9}, "span_s": 30.0}))
    assert state.load.snapshot(None)[""].sent_since_scrape == 9


def test_a_summary_adds_its_on_prem_only_arrivals_to_the_rate_as_of_when_they_came() -> None:
    """1,000 arrivals over a 10 s summary are 100 a second, not 1,000 (each would read as arriving
    at the summary), so the headroom kept for them is what they need; without a span, the lump."""
    now = [100.0]

    def rate_after(summary: dict[str, object]) -> float:
        state = gateway_state(config(), clock=lambda: now[0])
        apply_outcomes(state, FastOutcomes.model_validate(summary))
        return state.load.snapshot(None)[""].onprem_rps

    assert rate_after({"on_prem": {"": 1000}, "span_s": 10.0}) == pytest.approx(100.0, rel=1e-3)
    assert rate_after({"on_prem": {"": 20}, "span_s": 0.2}) == pytest.approx(100 * (1 - math.exp(-0.2)))
    assert rate_after({"on_prem": {"": 1000}}) == pytest.approx(1000.0)
