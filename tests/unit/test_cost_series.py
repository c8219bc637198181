"""Cost per tenant and model as bounded series, the on-prem cost, the bill made from counters, and
the runner's metrics kept clear of APISIX's exporter."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway_plugin import bill
from gateway_plugin.apisix_route import RouteError
from gateway_plugin.books.cost_series import OTHER, TopLabels, label_value
from gateway_plugin.books.metrics import RunnerMetrics
from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.runner import METRICS_LISTEN
from gateway_plugin.fast_path.book import apply_outcomes
from gateway_plugin.fast_path.route import APISIX_EXPORTER, config_snippet
from gateway_plugin.fast_path.summary import FastOutcomes
from gateway_plugin.policy.model import Decision, Reason
from testing.gateway import gateway_state


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _state(clock: Clock, **sections: object) -> GatewayState:
    config = SpillwayConfig.model_validate(
        {
            "targets": [
                {"name": "aws", "kind": "http", "url": "https://fn.example", "signing_key_env": None}
            ],
            "local": {"model_latency_targets_ms": {"add_sub": 50}},
            "metrics": {"listen": None, "tenant_series": 5, "model_series": 3},
            **sections,
        }
    )
    return gateway_state(config, clock=clock, wall=clock)


def _series(state: GatewayState, name: str) -> dict[tuple[str, str, str], float]:
    found = {}
    for family in text_string_to_metric_families(generate_latest(state.metrics.registry).decode()):
        for sample in family.samples:
            if sample.name == name:
                found[(sample.labels["tenant"], sample.labels["model"], sample.labels["target"])] = (
                    sample.value
                )
    return found


def test_50000_tenant_names_make_a_bounded_number_of_series_and_exact_totals() -> None:
    """Each name is a client's choice (a header, a path): at most N of each get a series, the rest
    count as other, and the sums are what was decided."""
    state = _state(Clock())
    for i in range(50_000):
        tenant = f"tenant-{i}" if i % 7 else "x" * 300 + str(i)
        decision = Decision(
            "aws" if i % 2 else "local", Reason.OVERFLOW_WARM, cost_usd=0.01 if i % 2 else 0.0, tenant=tenant
        )
        state.commit(decision, f"model-{i % 1000}" if i % 3 else "add_sub")
    requests = _series(state, "spillway_requests_total")
    spend = _series(state, "spillway_spend_usd_total")
    tenants = {t for t, _, _ in requests}
    models = {m for _, m, _ in requests}
    assert len(tenants - {OTHER}) <= 5 and OTHER in tenants
    assert models <= {"add_sub", OTHER}, "a model the cluster never reported got a series"
    assert len(requests) <= (5 + 1) * (3 + 1) * 2
    assert sum(requests.values()) == 50_000
    assert sum(spend.values()) == pytest.approx(25_000 * 0.01)
    assert all(len(t) <= 64 for t in tenants)
    assert state.metrics.cost.tenants.sketched <= 4 * 5


def test_the_fast_paths_usage_reaches_the_same_series_and_its_overflow_counts_as_other() -> None:
    state = _state(Clock())
    summary = FastOutcomes.parse(
        b'{"usage": {"aws\\tacme\\tadd_sub": [3, 0.03], "local\\t\\t": [2, 0], "local\\tacme\\t*": [1, 0],'
        b' "nowhere\\tacme\\tadd_sub": [9, 9]}, "usage_other": {"aws": [4, 0.04]}}'
    )
    apply_outcomes(state, summary)
    requests = _series(state, "spillway_requests_total")
    assert requests[("acme", "add_sub", "aws")] == 3
    assert requests[("none", "none", "local")] == 2
    assert requests[("acme", OTHER, "local")] == 1
    assert requests[(OTHER, OTHER, "aws")] == 4
    assert not [k for k in requests if k[2] == "nowhere"]
    assert sum(_series(state, "spillway_spend_usd_total").values()) == pytest.approx(0.07)


def test_a_heavy_spender_gets_a_series_where_a_flood_of_light_names_does_not() -> None:
    labels = TopLabels(2)
    assert labels.label("whale", 10.0) == "whale"
    for i in range(10_000):
        assert labels.label(f"minnow-{i}", 0.001) == OTHER
    assert labels.label("shark", 20.0) == "shark"
    assert labels.label("late", 1000.0) == OTHER, "no third series"
    assert label_value("other") != OTHER and label_value('a"}<b>').startswith("sha256:")


def test_the_on_prem_cluster_costs_its_gpus_by_the_hour_shared_among_runners() -> None:
    clock = Clock()
    state = _state(
        clock,
        local={"cost": {"gpus": 4, "usd_per_gpu_hour": 2.5}, "model_latency_targets_ms": {"add_sub": 50}},
    )
    state.metrics.cost.share = 0.5  # one of two runners
    clock.now += 3600
    state.refresh_gauges()
    metrics = generate_latest(state.metrics.registry).decode()
    assert "spillway_local_cost_usd_total 5.0" in metrics
    assert "spillway_local_cost_usd_per_hour 10.0" in metrics
    assert "spillway_local_gpus 4.0" in metrics
    assert 'spillway_latency_target_seconds{model="add_sub"} 0.05' in metrics


def test_the_bill_shares_the_clusters_cost_among_local_requests_and_reads_restarts() -> None:
    text = "\n".join(
        [
            'spillway_requests_total{tenant="a",model="m",target="local"} 30',
            'spillway_requests_total{tenant="b",model="m",target="local"} 10',
            'spillway_requests_total{tenant="a",model="m",target="aws"} 5',
            'spillway_spend_usd_total{tenant="a",model="m",target="aws"} 0.5',
            "spillway_local_cost_usd_total 8",
            "",
        ]
    )
    made = bill.from_metrics(text)
    costs = {(r.tenant, r.target): round(r.cost_usd, 6) for r in made.rows}
    assert costs == {("a", "local"): 6.0, ("b", "local"): 2.0, ("a", "aws"): 0.5}
    assert made.summary["total_usd"] == pytest.approx(8.5)
    assert made.summary["usd_per_1000_requests"] == pytest.approx(8.5 / 45 * 1000)
    samples = [(1.0, 5.0), (2.0, 7.0), (3.0, 2.0), (4.0, 4.0)]  # restarted between 2 and 3
    assert bill.increase(samples, 0.0, 4.0, new=True) == 5 + 2 + 2 + 2
    assert bill.increase(samples, 1.5, 4.0, new=False) == 2 + 2 + 2
    saved = bill.summarise(made.rows, 10.0, 4, 2.5, peak=300.0, local_peak=100.0)
    assert saved["gpus_for_peak"] == 12 and saved["peak_fleet_usd"] == 300.0
    assert saved["bursting_saved_pct"] == pytest.approx(100 * (1 - 8.5 / 300))


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_the_runners_metrics_keep_clear_of_apisixs_exporter(
    taken_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Both defaulted to 127.0.0.1:9091; now the runner's default is elsewhere, the config excerpt
    refuses a runner on the exporter's address, and a taken port says what to change."""
    exporter = f"{APISIX_EXPORTER['ip']}:{APISIX_EXPORTER['port']}"
    assert SpillwayConfig().metrics.listen == METRICS_LISTEN != exporter
    assert config_snippet(SpillwayConfig())["plugin_attr"]["prometheus"]["export_addr"] == APISIX_EXPORTER
    with pytest.raises(RouteError, match="APISIX's prometheus plugin exports"):
        config_snippet(SpillwayConfig.model_validate({"metrics": {"listen": exporter}}))
    with caplog.at_level(logging.ERROR):
        assert not RunnerMetrics().serve(f"127.0.0.1:{taken_port}")
    assert "set metrics.listen to a free port" in caplog.text


def test_costs_prints_a_runners_bill_as_csv_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway_plugin.cli import main
    from testing.http import QuietHandler, http_server_thread

    body = (
        b'spillway_requests_total{tenant="acme",model="add_sub",target="aws"} 4\n'
        b'spillway_spend_usd_total{tenant="acme",model="add_sub",target="aws"} 0.04\n'
        b'spillway_requests_total{tenant="acme",model="add_sub",target="local"} 6\n'
        b"spillway_local_cost_usd_total 0.6\n"
        b'spillway_warmup_spend_usd_total{target="aws"} 0.02\n'
    )

    class Metrics(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with http_server_thread(Metrics) as url:
        assert main(["costs", "--metrics-url", url + "/metrics"]) == 0
        csv_out = capsys.readouterr()
        assert main(["costs", "--metrics-url", url + "/metrics", "--format", "json"]) == 0
        json_out = capsys.readouterr().out
    assert csv_out.out.splitlines() == [
        "period,tenant,model,target,requests,cost_usd,kind",
        "since-start,acme,add_sub,aws,4,0.040000,requests",
        "since-start,,,aws,0,0.020000,warmup",
        "since-start,acme,add_sub,local,6,0.600000,requests",
    ]
    assert "total 0.6600 USD (cloud 0.0600, of which warm-up 0.0200; on-prem 0.6000)" in csv_out.err
    import json

    assert json.loads(json_out)["summary"]["usd_per_1000_requests"] == pytest.approx(66.0)
    assert main(["costs", "--metrics-url", "http://127.0.0.1:9/metrics"]) == 2
    assert "cannot read the counters from http://127.0.0.1:9/metrics" in capsys.readouterr().err
