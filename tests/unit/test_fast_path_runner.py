"""The runner's side of the fast path: the decision table it publishes, the counters the plugin
reports with each fetch, the fast path's outcomes, and the endpoint serving all of it (real
sockets, the runner's own app)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from functions.sidecar import free_port
from gateway_plugin.app import RunnerApp
from gateway_plugin.books import outcomes
from gateway_plugin.books.summed_outcomes import interleaved
from gateway_plugin.books.target_header import target_value
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path import table as decision_table
from gateway_plugin.fast_path.book import FastPathBook, FastPathReport, apply_outcomes
from gateway_plugin.fast_path.summary import FastOutcomes
from gateway_plugin.policy.snapshot import BreakerState, TenantState
from testing.gateway import gateway_state
from testing.http import http

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
AWS = target_value("aws", TOKEN)


def config(port: int = 0, **extra: Any) -> SpillwayConfig:
    return SpillwayConfig.model_validate(
        {
            "targets": [
                {"name": "aws", "kind": "http", "url": "https://fn.example", "signing_key_env": "MY_KEY"},
                {
                    "name": "fc",
                    "kind": "aliyun_fc",
                    "mode": "invoke",
                    "function_name": "f",
                    "service_name": "s",
                },
            ],
            "tenants": {"quotas": {"t1": {"requests_per_minute": 5, "hourly_usd": 1.0}}},
            "rules": [{"name": "keep", "match": {"uri": "health"}, "action": "local"}],
            "metrics": {"listen": None},
            "outcomes": {"listen": f"127.0.0.1:{port or free_port()}"},
            **extra,
        }
    )


def report(**fields: Any) -> FastPathReport:
    return FastPathReport.model_validate({"node": "n-1", **fields})


def test_the_table_carries_the_policy_the_state_and_how_to_reach_each_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_KEY", "the-signing-key-itself-0123456789")
    book = FastPathBook(gateway_state(config()))
    table = json.loads(book.exchange(report()))
    assert (
        table["format"] == decision_table.FORMAT
        and table["version"] == 1
        and table["decision_header"] is True
    )
    aws, fc = table["targets"]["aws"], table["targets"]["fc"]
    assert aws["value"] == AWS and aws["key_env"] == "MY_KEY" and not aws["invoke"]
    # What the plugin lets leave with the request: what inference needs, no credential.
    assert "content-type" in aws["forward"] and "x-spillway-signature" in aws["forward"]
    assert not {"authorization", "cookie", "proxy-authorization", "x-api-key"} & set(aws["forward"])
    assert fc["invoke"] and "value" not in fc, "invoke mode is the runner's alone"
    assert aws["breaker"] == "closed" and aws["spent_mark"] == 0.0
    assert table["policy"]["rules"][0] == {
        "name": "keep",
        "action": "local",
        "targets": [],
        "headers": [],
        "args": [],
        "models": [],
        "uri": "health",
    }
    assert table["policy"]["quotas"] == {"t1": {"requests_per_minute": 5, "hourly_usd": 1.0}}
    text = json.dumps(table)
    assert "the-signing-key-itself" not in text and TOKEN.decode() not in text, "no secret in the table"
    assert json.loads(book.exchange(report()))["version"] == 2


def test_reported_counters_are_taken_once_and_a_restarted_node_starts_afresh() -> None:
    state = gateway_state(config())
    book = FastPathBook(state)
    spent = lambda: state.ledger.spent("target:aws", state.wall())[0]  # noqa: E731
    table = json.loads(book.exchange(report(spent={"aws": 0.5, "nope": 9.0})))
    assert spent() == 0.5 and table["targets"]["aws"]["spent_mark"] == 0.5
    book.exchange(report(spent={"aws": 0.5}))
    assert spent() == 0.5, "the same cumulative count is not spent twice"
    book.exchange(report(spent={"aws": 0.75}))
    assert spent() == 0.75
    book.exchange(report(spent={"aws": 0.25}))  # nginx restarted: its counters began at zero
    assert spent() == 1.0
    book.exchange(report(hot={"": True}, fail_safe=3, dropped=1))
    assert state.load.snapshot(None)[""].overflowing
    assert state.metrics.fast_path_fail_safe._value.get() == 3


def test_a_restarted_runner_counts_a_nodes_spend_from_the_marks_of_the_table_it_holds() -> None:
    """A node's counters run from when its nginx started, across runner restarts: the runner
    before this one counted them up to the marks of the last table it gave the node, in windows
    this one does not know, and adding them whole would put the node's lifetime spend on this hour
    (no burst until it rolls). Past those marks is what no runner counted; a node without a table
    counts from zero."""
    state = gateway_state(config())
    book = FastPathBook(state)
    spent = lambda: state.ledger.spent("target:aws", state.wall())[0]  # noqa: E731
    older = {"node": "n-old", "marks": {"aws": [40.0, 5.0]}}
    table = json.loads(book.exchange(report(**older, spent={"aws": 41.0}, given_back={"aws": 5.0})))
    assert spent() == pytest.approx(1.0), "what it spent since its last table, not its lifetime"
    assert table["targets"]["aws"]["spent_mark"] == 41.0 and table["targets"]["aws"]["given_back_mark"] == 5.0
    book.exchange(
        report(node="n-old", marks={"aws": [41.0, 5.0]}, spent={"aws": 41.5}, given_back={"aws": 5.1})
    )
    assert spent() == pytest.approx(1.4)
    book.exchange(report(node="n-new", spent={"aws": 0.25}))
    assert spent() == pytest.approx(1.65), "a node with no table yet counts from zero"


def test_what_settled_streams_gave_back_comes_off_the_spend_once_and_is_marked_for_the_plugin() -> None:
    """Streams the plugin settled below their price give back through a counter of their own,
    which only grows: the runner takes its growth off the target's spend, and marks it in the
    table so the plugin counts only what it gave back since."""
    state = gateway_state(config())
    book = FastPathBook(state)
    spent = lambda: state.ledger.spent("target:aws", state.wall())[0]  # noqa: E731
    book.exchange(report(spent={"aws": 0.5}))
    table = json.loads(book.exchange(report(spent={"aws": 0.5}, given_back={"aws": 0.2})))
    assert spent() == pytest.approx(0.3)
    assert table["targets"]["aws"]["spent_mark"] == 0.5 and table["targets"]["aws"]["given_back_mark"] == 0.2
    book.exchange(report(spent={"aws": 0.6}, given_back={"aws": 0.2}))
    assert spent() == pytest.approx(0.4), "given back once"
    counter = state.metrics.spend.labels("aws")._value.get
    assert counter() == pytest.approx(0.5), "the counter only grows: what was given back is owed"
    book.exchange(report(spent={"aws": 0.9}, given_back={"aws": 0.2}))
    assert counter() == pytest.approx(0.7) and spent() == pytest.approx(0.7), "and taken off what follows"
    aws = json.loads(book.exchange(report(spent={"aws": 0.9}, given_back={"aws": 0.2})))["targets"]["aws"]
    assert aws["stream_usd"] == [0.0000002, 4.0 * 0.0000166667, 0.0, 0.0, 0.0, 0.0], (
        "the price a stream settles at"
    )


def test_a_report_is_bounded_and_its_node_named_plainly() -> None:
    for bad in (
        {"node": ""},
        {"node": "a b"},
        {"node": "n", "spent": {f"t{i}": 1.0 for i in range(1001)}},
        {"node": "n", "fail_safe": -1},
        {"node": "n", "spent": {"aws": float("inf")}},
    ):
        with pytest.raises(ValidationError):
            FastPathReport.model_validate(bad)


def test_a_workers_summary_feeds_metrics_breakers_warm_pools_tenants_and_the_residency_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = gateway_state(config(breaker={"consecutive_failures": 3}))
    summary = FastOutcomes.model_validate_json(
        json.dumps(
            {
                "decisions": {
                    "local;residency": 2,
                    "aws;overflow_cold": 5,
                    "shed;table_stale+local_saturated": 1,
                    "aws;made_up": 9,
                    "elsewhere;local_ok": 9,
                },
                "sent_local": {"": 7},
                "local_s": {"": [4, 1.2]},
                "cloud": {"aws": [0, 5, 0.5], "nope": [1, 1, 0.1]},
                "instances": {"aws": {"i-1": True, "i-2": False}},
                "tenants": {"t1": [2, 0.25], "free": [3, 1.0]},
                "residency": [{"path": "/v2/models/m/infer", "classification": "secret"}],
                "table_ages": [3, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                "table_age_sum": 2.5,
            }
        )
    )
    with caplog.at_level("INFO", "spillway.residency"):
        apply_outcomes(state, summary)
    counted = {k: c._value.get() for k, c in state.metrics._decision_children.items()}
    assert counted == {
        ("local", "residency"): 2,
        ("aws", "overflow_cold"): 5,
        ("shed", "table_stale+local_saturated"): 1,
    }, "labels outside the config's reasons are not counted"
    assert state.metrics.residency_kept._value.get() == 2
    assert any('"via": "fast_path"' in r.message and "secret" in r.message for r in caplog.records)
    now = state.clock()
    assert state.breakers["aws"].current(now) is BreakerState.OPEN
    assert state.pools["aws"].warm(now) == 2
    local = state.load.snapshot(None)[""]
    assert local.observed_ms == pytest.approx(300.0) and local.sent_since_scrape == 7
    book = state.tenants.get("t1")
    assert book is not None and book.last_minute(state.wall()) == 2 and book.spent(state.wall())[0] == 0.25
    assert state.tenants.get("free") is None, "a tenant without a quota has no book"
    assert (
        state.metrics.fast_path_table_age.counts[:2] == [3, 2]
        and state.metrics.fast_path_table_age.counts[-1] == 1
    )


def test_a_tenant_is_counted_at_decision_and_its_stream_settled_after() -> None:
    """The plugin reports a tenant's arrival and price from the decision, and later what its stream
    cost less (a negative amount): the book ends at the bill, and stays at nothing or more."""
    state = gateway_state(config())
    summary = lambda tenants: FastOutcomes.model_validate({"tenants": tenants})  # noqa: E731
    apply_outcomes(state, summary({"t1": [1, 0.5]}))
    apply_outcomes(state, summary({"t1": [0, -0.3]}))
    book = state.tenants.get("t1")
    assert book is not None
    assert book.last_minute(state.wall()) == 1 and book.spent(state.wall())[0] == pytest.approx(0.2)
    apply_outcomes(state, summary({"t1": [0, -5.0]}))
    assert book.spent(state.wall())[0] == 0.0
    unbounded = FastOutcomes.parse(b'{"tenants": {"t1": [2, -Infinity]}}')
    assert unbounded.tenants == {"t1": (2, 0.0)} and unbounded.invalid == 1, "its arrivals count"


def test_a_summary_is_bounded() -> None:
    cases: tuple[dict[str, object], ...] = (
        {"decisions": {f"local;r{i}": 1 for i in range(1001)}},
        {"residency": [{}] * 1001},
        {"table_ages": [1] * 65},
        {"cloud": [1, 2]},
    )
    for bad in cases:
        with pytest.raises(ValidationError):
            FastOutcomes.model_validate(bad)


def test_a_few_scattered_failures_among_many_successes_do_not_open_a_breaker() -> None:
    state = gateway_state(config())
    summary = FastOutcomes.model_validate({"cloud": {"aws": [1000, 5, 1.0]}})
    apply_outcomes(state, summary)
    assert state.breakers["aws"].current(state.clock()) is BreakerState.CLOSED
    failing = FastOutcomes.model_validate({"cloud": {"aws": [10, 30, 1.0]}})
    apply_outcomes(state, failing)
    assert state.breakers["aws"].current(state.clock()) is BreakerState.OPEN, "a 75 % error rate opens it"


def test_interleaving_keeps_the_proportion_and_spreads_the_failures() -> None:
    results = list(interleaved(95, 5, 20))
    assert len(results) == 20 and results.count(False) == 1
    assert list(interleaved(0, 5, 5)) == [False] * 5
    half = list(interleaved(10, 10, 10))
    assert half.count(False) == 5 and all(a != b for a, b in itertools.pairwise(half))
    assert list(interleaved(0, 0, 3)) == []


def test_a_half_open_breaker_closes_only_on_a_batch_without_failures() -> None:
    state = gateway_state(config(breaker={"consecutive_failures": 1, "cooldown_s": 0.001}))
    breaker, now = state.breakers["aws"], state.clock()
    breaker.record(False, now)
    assert breaker.current(now) is BreakerState.OPEN
    breaker.opened_at -= 1
    assert breaker.current(state.clock()) is BreakerState.HALF_OPEN
    apply_outcomes(state, FastOutcomes.model_validate({"cloud": {"aws": [50, 1, 1.0]}}))
    assert breaker.current(state.clock()) is BreakerState.OPEN
    breaker.opened_at -= 10
    assert breaker.current(state.clock()) is BreakerState.HALF_OPEN
    apply_outcomes(state, FastOutcomes.model_validate({"cloud": {"aws": [3, 0, 1.0]}}))
    assert breaker.current(state.clock()) is BreakerState.CLOSED


def _post(port: int, path: str, body: bytes, auth: str | None) -> tuple[int, bytes]:
    headers = {"authorization": auth} if auth else {}
    status, _, answer = http("POST", f"http://127.0.0.1:{port}{path}", body, headers)
    return status, answer


def test_the_endpoint_serves_tables_only_to_apisix_and_only_for_good_reports() -> None:
    port = free_port()
    auth = outcomes.auth_header(TOKEN)

    async def go() -> list[tuple[int, bytes]]:
        app = RunnerApp(config(port, targets=[{"name": "aws", "kind": "http", "url": "https://fn.example"}]))
        app.start()
        try:
            app.state.breakers["aws"].state = BreakerState.OPEN
            app.state.breakers["aws"].cooldown_s = 60
            app.state.breakers["aws"].opened_at = app.state.clock()
            good = json.dumps({"node": "n-1"}).encode()
            return [
                await asyncio.to_thread(_post, port, "/spillway/table", good, auth),
                await asyncio.to_thread(_post, port, "/spillway/table", good, None),
                await asyncio.to_thread(_post, port, "/spillway/table", b"{}", auth),
                await asyncio.to_thread(_post, port, "/spillway/table", b"x" * (300 << 10), auth),
                await asyncio.to_thread(_post, port, "/spillway/fast-outcomes", b'{"decisions": {}}', auth),
                await asyncio.to_thread(_post, port, "/spillway/fast-outcomes", b'{"cloud": 1}', auth),
            ]
        finally:
            await app.aclose()

    ok, unauthenticated, malformed, too_big, summary, bad_summary = asyncio.run(go())
    assert ok[0] == 200 and json.loads(ok[1])["targets"]["aws"]["breaker"] == "open"
    assert unauthenticated[0] == 401
    assert malformed[0] == 400 and b"node" in malformed[1]
    assert too_big[0] == 413
    assert summary[0] == 204 and bad_summary[0] == 400


def test_every_file_of_the_lua_plugin_ships_in_the_wheel() -> None:
    import tomllib

    from gateway_plugin.fast_path.route import lua_path
    from testing.paths import ROOT

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for pattern in data["gateway_plugin"] for p in (ROOT / "gateway_plugin").glob(pattern)}
    assert shipped == set(lua_path().rglob("*.lua")) and len(shipped) >= 6


def test_a_quota_names_a_tenant_of_at_most_256_characters() -> None:
    """Longer names reach the fast path's books only as their hash, so a quota could not match."""
    config(tenants={"quotas": {"t" * 256: {"concurrency": 1}}})
    with pytest.raises(ValidationError, match="256"):
        config(tenants={"quotas": {"t" * 257: {"concurrency": 1}}})


def test_the_table_carries_only_tenants_at_a_limit_and_at_most_max_tenants() -> None:
    """10,000 rotating tenant names under a default quota: only those at their rate quota, or a
    request's cost from a spend quota, are published, and never more than MAX_TENANTS."""
    state = gateway_state(
        config(tenants={"default": {"requests_per_minute": 5}, "quotas": {"t1": {"hourly_usd": 1.0}}})
    )
    wall = state.wall()
    for i in range(10_000):
        state.tenants.book(f"rotating-{i}").arrivals.extend([wall] * 4)
    state.tenants.book("over").arrivals.extend([wall] * 5)
    state.tenants.book("t1").add_spend(0.999999, wall)
    book = FastPathBook(state)
    assert set(book.table()["tenants"]) == {"over", "t1"}
    for i in range(2, 10_000):  # the two oldest made room for "over" and "t1"
        state.tenants.book(f"rotating-{i}").arrivals.append(wall)
    tenants = book.table()["tenants"]
    assert isinstance(tenants, dict) and len(tenants) == decision_table.MAX_TENANTS
    assert "rotating-9999" in tenants and "rotating-2" not in tenants, "the most recently seen are kept"


def test_leaving_out_tenants_below_their_limits_changes_no_decision() -> None:
    policy = gateway_state(config(tenants={"default": {"requests_per_minute": 5, "daily_usd": 1.0}})).policy
    below = TenantState(4, 0, 0.0, 0.5)
    at_rate, near_spend = TenantState(5, 0, 0.0, 0.0), TenantState(0, 0, 0.0, 1.0)
    states = [("a", below), ("b", at_rate), ("c", near_spend)]
    kept = decision_table.tenants_at_a_limit(policy, [(name, lambda s=s: s) for name, s in states])
    assert set(kept) == {"b", "c"}


def test_the_config_excerpt_names_every_secret_variable_and_no_value(tmp_path: Path) -> None:
    path = tmp_path / "spillway.yaml"
    made = config(
        targets=[
            {"name": "aws", "kind": "http", "url": "https://a.example", "signing_key_env": "KEY_A"},
            {"name": "gcp", "kind": "http", "url": "https://b.example", "signing_key_env": "KEY_B"},
            {"name": "az", "kind": "http", "url": "https://c.example", "signing_key_env": "KEY_A"},
            {"name": "raw", "kind": "http", "url": "https://d.example", "signing_key_env": None},
        ],
        shared_state={"redis_url": "redis://127.0.0.1:6379/0", "password_env": "REDIS_PW"},
    )
    path.write_text(yaml.safe_dump(made.model_dump(mode="json")))
    secret = "key-value-that-must-not-show-0123456789"
    printed = subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "apisix-lua-path", "--config", str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "KEY_A": secret, "KEY_B": secret, "REDIS_PW": secret},
    ).stdout
    envs = yaml.safe_load(printed)["nginx_config"]["envs"]
    assert envs == ["SPILLWAY_ROUTE_TOKEN", "KEY_A", "KEY_B", "REDIS_PW"]
    assert secret not in printed


def test_the_runner_warns_at_start_of_a_target_whose_signing_key_is_empty(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEY_SET", "set-key-value-0123456789")
    monkeypatch.setenv("KEY_EMPTY", "")
    targets = [
        {"name": "aws", "kind": "http", "url": "https://a.example", "signing_key_env": "KEY_SET"},
        {"name": "gcp", "kind": "http", "url": "https://b.example", "signing_key_env": "KEY_EMPTY"},
    ]

    async def go() -> None:
        app = RunnerApp(config(targets=targets, outcomes={"listen": None}))
        app.start()
        await app.aclose()

    with caplog.at_level("WARNING", "spillway"):
        asyncio.run(go())
    warned = [r.getMessage() for r in caplog.records if "signing_key_env" in r.getMessage()]
    assert len(warned) == 1 and "gcp" in warned[0] and "KEY_EMPTY" in warned[0], warned
    assert not any("set-key-value" in r.getMessage() for r in caplog.records)
