"""A wedged on-prem member (its metrics answer, its inference fails) is not capacity.

Before, a member counted as capacity for as long as its metrics page answered: a pod with a hung GPU
or a model that failed to load looked idle (its queue empty, its counters still), so the policy saw
room the cluster did not have and kept sending requests home to fail. The gateway's own answers name
the member each request went to (APISIX's ``$upstream_addr``), through both routes' outcomes; the
real APISIX and tritonservers are in ``tests/integration/test_apisix_wedged.py``.
"""

from __future__ import annotations

import logging

import pytest

from gateway_plugin.books import outcomes
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.book import apply_outcomes
from gateway_plugin.fast_path.summary import FastOutcomes
from gateway_plugin.signals.load import LoadTracker
from gateway_plugin.signals.members import MemberState
from testing.gateway import gateway_state
from tests.unit.test_local_members import Cluster, Pod

PODS = {f"http://10.0.0.{i}:8002/metrics": f"10.0.0.{i}:8000" for i in range(1, 4)}


def three(**tracker: float) -> Cluster:
    cluster = Cluster({url: Pod(compute_ms=10) for url in PODS}, **tracker)
    cluster.tracker.members.addressed(PODS, None)
    for _ in range(2):
        cluster.round()
    return cluster


def test_a_member_that_fails_every_request_leaves_the_capacity_until_it_serves_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = three(member_parallelism=2)
    members = cluster.tracker.members
    assert cluster.load()[2] == 6.0
    wedged = cluster.pods["http://10.0.0.2:8002/metrics"]
    wedged.serving = False
    with caplog.at_level(logging.WARNING, "spillway.signals"):
        for _ in range(2):
            members.answered("10.0.0.2:8000", 0, 1, 1)
        cluster.round()
        assert cluster.load()[2] == 6.0, "two failures are not yet a wedged member"
        members.answered("10.0.0.2:8000", 0, 1, 1)
        for _ in range(3):
            cluster.round()
    assert cluster.load()[2] == 4.0
    assert members.counts()[MemberState.WEDGED] == 1 and members.counts()[MemberState.UP] == 2
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "10.0.0.2" in said[0] and "failed its last 3 requests" in said[0], said
    members.answered("10.0.0.2:8000", 1, 0, 0)
    cluster.round()
    assert cluster.load()[2] == 6.0 and members.counts()[MemberState.WEDGED] == 0


def test_an_answer_between_failures_starts_the_count_again() -> None:
    cluster = three(member_parallelism=1)
    members = cluster.tracker.members
    for ok in (False, False, True, False, False):
        members.answered("10.0.0.1:8000", int(ok), int(not ok), int(not ok))
    cluster.round()
    assert cluster.load()[2] == 3.0
    members.answered("10.0.0.1:8000", 3, 5, 2)  # summed: two failed after its last ok answer
    cluster.round()
    assert cluster.load()[2] == 3.0
    cluster.pods["http://10.0.0.1:8002/metrics"].serving = False
    members.answered("10.0.0.1:8000", 0, 1, 1)  # the third in a row, in the next batch
    cluster.round()
    assert cluster.load()[2] == 2.0


def test_a_batch_with_answers_from_before_the_wedge_still_counts_the_failures_after_it() -> None:
    """A summed batch spanning the moment a member wedged holds its last ok answers and its first
    failures; the failures after the last ok one count, so the few requests it gets afterwards
    (APISIX's health checks take it out, the cluster's breaker sends little home) finish the run."""
    cluster = three(member_parallelism=1)
    members = cluster.tracker.members
    cluster.pods["http://10.0.0.1:8002/metrics"].serving = False
    members.answered("10.0.0.1:8000", 40, 2, 2)
    members.answered("10.0.0.1:8000", 0, 1, 1)
    cluster.round()
    assert cluster.load()[2] == 2.0


def test_its_own_counters_moving_bring_it_back() -> None:
    """A member APISIX no longer sends to is never answered by again: its success counter moving
    (another gateway's requests, a retry that got through) says it serves."""
    cluster = three(member_parallelism=1)
    pod = cluster.pods["http://10.0.0.3:8002/metrics"]
    pod.serving = False
    cluster.tracker.members.answered("10.0.0.3:8000", 0, 5, 5)
    for _ in range(2):
        cluster.round()
    assert cluster.load()[2] == 2.0
    pod.serving = True
    cluster.round()
    assert cluster.load()[2] == 3.0


def test_a_request_it_served_before_it_wedged_does_not_bring_it_back() -> None:
    """Its counters are read a scrape period late and its answers a batch late, so the first rounds
    after it is found wedged may show a request it served before: only later ones say it serves."""
    cluster = three(member_parallelism=1)
    pod = cluster.pods["http://10.0.0.3:8002/metrics"]
    cluster.tracker.members.answered("10.0.0.3:8000", 0, 5, 5)
    cluster.round()  # read before the answers came: its counters moved
    pod.serving = False
    cluster.round()
    assert cluster.load()[2] == 2.0
    pod.serving = True
    cluster.round()
    assert cluster.load()[2] == 3.0


def test_every_member_wedged_counts_them_all_and_leaves_it_to_the_clusters_breaker() -> None:
    """Answers a client can make fail (a request Triton answers 500) cost at most the members that
    failed them: never the whole cluster's capacity."""
    cluster = three(member_parallelism=1)
    for pod, address in zip(cluster.pods.values(), PODS.values(), strict=True):
        pod.serving = False
        cluster.tracker.members.answered(address, 0, 3, 3)
    cluster.round()
    assert cluster.load()[2] == 3.0
    assert cluster.tracker.members.counts()[MemberState.WEDGED] == 3


def test_a_wedged_member_leaves_the_load_too() -> None:
    """Its pending requests are not the cluster's backlog: they fail, they do not wait."""
    cluster = three(member_parallelism=1)
    cluster.pods["http://10.0.0.1:8002/metrics"].pending = 30
    cluster.pods["http://10.0.0.1:8002/metrics"].serving = False
    cluster.round()
    assert cluster.load()[3] == 30
    cluster.tracker.members.answered("10.0.0.1:8000", 0, 3, 3)
    cluster.round()
    assert cluster.load()[3] == 0


def test_answers_name_members_by_address_by_dns_port_or_by_host_alone() -> None:
    tracker = LoadTracker(2.0, lambda: 100.0, member_parallelism=1)  # type: ignore[arg-type]
    members = tracker.members
    urls = ["http://10.0.0.1:8002/metrics", "http://[fd00::2]:8002/metrics", "http://10.0.0.3:8002/metrics"]
    members.addressed({}, 8000)
    tracker.round({url: {} for url in urls})
    for address in ("10.0.0.1:8000", "[fd00::2]:8000"):
        members.answered(address, 0, 3, 3)
    members.answered("10.0.0.3:9999", 0, 3, 3)  # another port of a member's host: the host names it
    members.answered("10.9.9.9:8000", 0, 3, 3)  # no member's
    assert members.counts()[MemberState.WEDGED] == 3
    shared = ["http://127.0.0.1:8002/metrics", "http://127.0.0.1:8012/metrics"]
    members.addressed({}, None)
    tracker.round({url: {} for url in shared})
    members.answered("127.0.0.1:8000", 0, 3, 3)
    assert members.counts()[MemberState.WEDGED] == 0, "a host two members share names neither"


def test_the_config_says_each_listed_endpoints_address_and_discoverys_port() -> None:
    local = SpillwayConfig.model_validate(
        {
            "local": {
                "endpoints": [
                    {"url": "http://10.0.0.1:8000/", "metrics_url": "http://10.0.0.1:8002/metrics"}
                ],
                "discovery": {"dns": {"name": "triton.ml.svc.cluster.local", "port": 8001}},
                "member_parallelism": 1,
            }
        }
    ).local
    assert local.member_addresses() == ({"http://10.0.0.1:8002/metrics": "10.0.0.1:8000"}, 8001)


@pytest.mark.parametrize(
    ("addresses", "statuses", "tried"),
    [
        ("10.0.0.1:8000", "503", [("10.0.0.1:8000", False)]),
        ("10.0.0.1:8000, 10.0.0.2:8000", "502, 200", [("10.0.0.1:8000", False), ("10.0.0.2:8000", True)]),
        ("[fd00::1]:8000 : 10.0.0.2:8000", "504 : 404", [("[fd00::1]:8000", False), ("10.0.0.2:8000", True)]),
        ("unix:/run/x.sock", "200", []),
        ("10.0.0.1:8000", None, []),
        ("10.0.0.1:8000", "-", []),
        (", ".join(["10.0.0.1:8000"] * 40), ", ".join(["502"] * 40), [("10.0.0.1:8000", False)] * 16),
    ],
)
def test_each_upstream_a_request_tried_is_paired_with_its_status(
    addresses: str, statuses: str | None, tried: list[tuple[str, bool]]
) -> None:
    assert outcomes.attempts(addresses, statuses) == tried


CONFIG = {
    "local": {
        "endpoints": [{"url": f"http://{address}", "metrics_url": url} for url, address in PODS.items()],
        "member_parallelism": 1,
    },
    "targets": [{"name": "aws", "kind": "http", "url": "http://127.0.0.1:9"}],
}


@pytest.mark.parametrize("route", ["ext-plugin", "fast path"])
def test_both_routes_outcomes_name_the_member_that_failed(route: str) -> None:
    state = gateway_state(SpillwayConfig.model_validate(CONFIG))
    state.load.round({url: {} for url in PODS})
    if route == "ext-plugin":
        entries = [
            {
                "status": 503,
                "upstream_status": "503",
                "upstream": "10.0.0.2:8000",
                "uri": "/v2/models/m/infer",
            },
            {"status": 200, "upstream_status": "502, 200", "upstream": "10.0.0.2:8000, 10.0.0.1:8000"},
            {"status": 503, "upstream_status": "503", "upstream": "10.0.0.2:8000"},
        ]
        outcomes.apply(state, outcomes.read_entries(entries).entries)
    else:
        apply_outcomes(
            state,
            FastOutcomes.model_validate(
                {"members": {"10.0.0.2:8000": [0, 3, 3], "10.0.0.1:8000": [4, 0, 0]}}
            ),
        )
    state.load.round({url: {} for url in PODS})
    assert state.load.members.counts()[MemberState.WEDGED] == 1
    assert state.load.capacity == 2.0
    state.refresh_gauges()
    assert state.metrics.registry.get_sample_value("spillway_local_capacity", {"model": "*"}) == 2.0
