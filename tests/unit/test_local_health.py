"""The cluster's own breaker: opened by its failed answers (from the route's logger and from the
fast path's summaries), never by missing metrics alone; probed when half-open; closed only after
``successes_to_close`` probes in a row; and a metrics endpoint that refuses connections read as
corroboration, not as a verdict."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import requests

from functions.sidecar import free_port
from gateway_plugin.app import http_fetcher
from gateway_plugin.books import outcomes
from gateway_plugin.config import ConfigError, LocalHealth, SpillwayConfig
from gateway_plugin.explain import explain
from gateway_plugin.fast_path import table as decision_table
from gateway_plugin.fast_path.book import FastPathBook, apply_outcomes
from gateway_plugin.fast_path.summary import FastOutcomes
from gateway_plugin.health.local_health import CLOSED, HALF_OPEN, OPEN, LocalBreaker
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.model import LOCAL, SHED, Decision, Reason
from gateway_plugin.policy.snapshot import Snapshot
from gateway_plugin.signals.load import LoadTracker
from gateway_plugin.signals.scraper import Scraper, refused
from testing.gateway import gateway_state
from testing.standins import metrics_feed
from tests.unit.test_policy import req

SETTINGS = LocalHealth(failures_to_open=3, window=10, failure_rate=0.5, open_s=2, max_open_s=8)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failures_in_a_row_open_it_and_an_answer_between_them_starts_the_count_again() -> None:
    b = LocalBreaker()
    for ok in (False, False, True, False, False):
        b.record(SETTINGS, ok, 0, refused=False)
    assert b.current(SETTINGS, 0, False) is CLOSED
    b.record(SETTINGS, False, 0, refused=False)
    assert b.current(SETTINGS, 0, False) is OPEN


def test_a_failure_share_over_the_window_opens_it_without_a_run() -> None:
    b = LocalBreaker()
    for i in range(10):
        b.record(SETTINGS, i % 2 == 0, 0, refused=False)
    assert b.current(SETTINGS, 0, False) is OPEN


def test_half_open_lets_one_probe_through_and_closes_only_after_enough_answered() -> None:
    b = LocalBreaker()
    for _ in range(3):
        b.record(SETTINGS, False, 0, refused=False)
    assert not b.probe_allowed(SETTINGS, 1.9, False)
    assert b.probe_allowed(SETTINGS, 2.0, False) and b.current(SETTINGS, 2.0, False) is HALF_OPEN
    b.dispatched(SETTINGS, 2.0, False)
    assert not b.probe_allowed(SETTINGS, 2.1, False), "one probe at a time"
    b.record(SETTINGS, True, 2.2, refused=False)
    assert b.current(SETTINGS, 2.2, False) is HALF_OPEN, "one answer is not yet recovery"
    b.dispatched(SETTINGS, 2.3, False)
    b.record(SETTINGS, True, 2.4, refused=False)
    assert b.current(SETTINGS, 2.4, False) is CLOSED


def test_a_failed_probe_reopens_it_for_twice_as_long_up_to_the_ceiling() -> None:
    b = LocalBreaker()
    for _ in range(3):
        b.record(SETTINGS, False, 0, refused=False)
    waits = []
    now = 0.0
    for _ in range(4):
        opened = now
        while b.current(SETTINGS, now, False) is OPEN:
            now += 0.5
        waits.append(now - opened)
        b.dispatched(SETTINGS, now, False)
        b.record(SETTINGS, False, now, refused=False)
    assert waits == [2.0, 4.0, 8.0, 8.0]


def test_a_probe_whose_answer_never_came_frees_its_place() -> None:
    b = LocalBreaker()
    for _ in range(3):
        b.record(SETTINGS, False, 0, refused=False)
    b.dispatched(SETTINGS, 2, False)
    assert not b.probe_allowed(SETTINGS, 9, False)
    assert b.probe_allowed(SETTINGS, 10.5, False)


def test_with_metrics_refused_one_failure_opens_it_no_probe_goes_until_they_answer_again() -> None:
    b = LocalBreaker()
    b.record(SETTINGS, False, 0, refused=True)
    assert b.current(SETTINGS, 0, True) is OPEN
    assert b.current(SETTINGS, 5, True) is OPEN, "no probe into a host that refuses"
    assert b.current(SETTINGS, 5.1, False) is HALF_OPEN, "its metrics answer: probe at once"
    still = LocalBreaker()
    still.record(SETTINGS, False, 0, refused=True)
    assert still.current(SETTINGS, 8, True) is HALF_OPEN, "only the metrics port closed: probe at the ceiling"


def test_answers_to_requests_sent_before_it_opened_change_nothing() -> None:
    b = LocalBreaker()
    for _ in range(3):
        b.record(SETTINGS, False, 0, refused=False)
    for _ in range(10):
        b.record(SETTINGS, True, 1, refused=False)
    assert b.current(SETTINGS, 1, False) is OPEN


def test_missing_metrics_alone_never_mark_the_cluster_failing() -> None:
    clock = Clock()
    tracker = LoadTracker(1.0, clock, health=SETTINGS)
    tracker.refused = True
    clock.now += 60
    load = tracker.snapshot("m")[""]
    assert not load.fresh and not load.failing
    d = decide(req(), Snapshot(tracker.snapshot("m")), build_policy(config()))
    assert d[:2] == (LOCAL, Reason.SIGNALS_MISSING)


def config(**local: Any) -> SpillwayConfig:
    health = {"failures_to_open": 3, "open_s": 2, "successes_to_close": 1}
    aws = {"name": "aws", "kind": "http", "url": "https://fn.example", "signing_key_env": None}
    return SpillwayConfig.model_validate(
        {
            # A model the config names is tracked before any scrape reports it.
            "local": {"health": health, "model_latency_targets_ms": {"add_sub": 200}, **local},
            "targets": [aws],
            "metrics": {"listen": None},
        }
    )


def entry(status: str, uri: str = "/v2/models/add_sub/infer") -> outcomes.Outcome:
    fields = {"status": status, "upstream_status": status, "upstream_s": "0.0", "uri": uri}
    return outcomes.Outcome.model_validate(fields)


def test_the_loggers_entries_open_the_models_breaker_and_every_models() -> None:
    clock = Clock()
    state = gateway_state(config(), clock=clock)
    outcomes.apply(state, [entry("502")] * 2)
    assert not state.load.snapshot("add_sub")["add_sub"].failing
    outcomes.apply(state, [entry("504")])
    loads = state.load.snapshot("add_sub")
    assert loads["add_sub"].failing and loads[""].failing
    other = state.load.snapshot("unknown")
    assert set(other) == {""}, "a client's made-up model is counted under every model"


def test_answers_of_a_cloud_target_or_a_4xx_from_the_cluster_leave_it_closed() -> None:
    state = gateway_state(config(), clock=Clock())
    aws = state.route_value("aws")
    cloud = outcomes.Outcome.model_validate({"target": aws, "status": "502", "upstream_status": "502"})
    outcomes.apply(state, [cloud] * 5 + [entry("400")] * 5)
    assert not state.load.snapshot("add_sub")["add_sub"].failing


def test_a_local_decision_while_half_open_is_the_probe_and_its_answer_brings_traffic_home() -> None:
    clock = Clock()
    state = gateway_state(config(), clock=clock)
    outcomes.apply(state, [entry("502")] * 3)
    clock.now += 2
    load = state.load.snapshot("add_sub")["add_sub"]
    assert load.failing and load.probe_allowed
    state.commit(Decision(LOCAL, Reason.SIGNALS_MISSING), "add_sub")
    load = state.load.snapshot("add_sub")["add_sub"]
    assert load.failing and not load.probe_allowed
    outcomes.apply(state, [entry("200")])
    assert not state.load.snapshot("add_sub")["add_sub"].failing


def test_the_fast_paths_summaries_open_it_and_the_table_carries_it() -> None:
    state = gateway_state(config(), clock=Clock())
    apply_outcomes(state, FastOutcomes.model_validate({"local_answers": {"add_sub": [40, 1]}}))
    assert not state.load.snapshot("add_sub")["add_sub"].failing, "a scattered failure is no run"
    apply_outcomes(state, FastOutcomes.model_validate({"local_answers": {"add_sub": [0, 3]}}))
    table = json.loads(decision_table.encode(FastPathBook(state).table()))
    assert table["format"] == decision_table.FORMAT
    assert table["local"]["add_sub"]["failing"] is True
    assert table["local"]["add_sub"]["probe_allowed"] is False
    state.refresh_gauges()
    sample = state.metrics.registry.get_sample_value("spillway_local_failing", {"model": "add_sub"})
    assert sample == 1.0


def test_a_shed_decision_while_failing_is_what_the_gateway_answers_503_with() -> None:
    state = gateway_state(config(), clock=Clock())
    outcomes.apply(state, [entry("502")] * 3)
    d = decide(req(None, model="add_sub"), Snapshot(state.load.snapshot("add_sub")), state.policy)
    assert (d.target, d.reason, d.status, d.retry_after_s) == (SHED, Reason.LOCAL_FAILING, 503, 1)


def test_a_refused_connection_is_told_from_a_timeout_or_a_bad_answer_on_a_real_socket() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(requests.ConnectionError) as caught:
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1)
    assert refused(caught.value)
    assert not refused(TimeoutError("read timed out"))
    assert not refused(ValueError("metrics endpoint answered 500"))


def test_a_scrape_of_a_port_nothing_listens_on_says_refused_and_a_good_one_clears_it() -> None:
    tracker = LoadTracker(1.0)
    scraper = Scraper(tracker, http_fetcher(), [f"http://127.0.0.1:{free_port()}/metrics"], 0.1)
    assert not asyncio.run(scraper.scrape_once())
    assert tracker.refused
    with metrics_feed() as feed:
        assert asyncio.run(Scraper(tracker, http_fetcher(), [feed.url], 0.1).scrape_once())
        assert not tracker.refused
        one_down = [feed.url, f"http://127.0.0.1:{free_port()}/metrics"]
        assert asyncio.run(Scraper(tracker, http_fetcher(), one_down, 0.1).scrape_once()), "one answered"
        assert not tracker.refused, "one node down is not the cluster refusing"


def test_max_open_s_below_open_s_is_refused_with_what_to_do() -> None:
    with pytest.raises((ConfigError, ValueError), match="raise max_open_s or lower open_s"):
        SpillwayConfig.model_validate({"local": {"health": {"open_s": 10, "max_open_s": 5}}})


def test_check_config_explains_when_the_cluster_counts_as_failing() -> None:
    said = explain(config())
    assert "local health: 3 failed local answers in a row" in said
    assert "missing metrics alone keep everything local" in said
