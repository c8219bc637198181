"""The on-prem cluster's members as Kubernetes runs them: a round reads every member that answered,
a member that fails is dropped after a short grace and taken back when it answers, and the
capacity the policy sees is the members' that count.

The rounds are driven with each member's metrics page as Triton writes it, through the scraper's
own parsing, on a clock the test moves (the scraper's fetch is its I/O edge); the real sockets of a
member going away are in ``tests/integration/test_apisix_members.py``.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.policy.model import Policy
from gateway_plugin.policy.overflow import estimated_latency_ms
from gateway_plugin.signals.exposition import samples_of
from gateway_plugin.signals.load import LoadTracker
from gateway_plugin.signals.members import MemberState
from gateway_plugin.signals.scraper import Scraper
from testing.gateway import gateway_state


class Pod:
    """One Triton's metrics page: cumulative counters moving by ``per_round`` requests each of
    ``compute_ms`` after ``queue_ms`` in queue, and ``pending`` waiting now."""

    def __init__(self, queue_ms: float = 0.0, compute_ms: float = 10.0, pending: int = 0) -> None:
        self.queue_ms, self.compute_ms, self.pending = queue_ms, compute_ms, pending
        self.up = True
        self.serving = True  # False: its inference fails, so its success counter stands still
        self.success = self.queue_us = self.compute_us = 0.0

    def restart(self) -> None:
        self.success = self.queue_us = self.compute_us = 0.0

    def page(self, per_round: int = 10) -> str:
        if not self.up:
            raise ConnectionRefusedError("connection refused")
        per_round = per_round if self.serving else 0
        self.success += per_round
        self.queue_us += per_round * self.queue_ms * 1000
        self.compute_us += per_round * self.compute_ms * 1000
        labels = '{model="m",version="1"}'
        return (
            f"nv_inference_request_success{labels} {self.success}\n"
            f"nv_inference_queue_duration_us{labels} {self.queue_us}\n"
            f"nv_inference_compute_infer_duration_us{labels} {self.compute_us}\n"
            f"nv_inference_pending_request_count{labels} {self.pending}\n"
        )


class Cluster:
    def __init__(self, pods: dict[str, Pod], drop_after_s: float = 1.0, **tracker: float) -> None:
        self.pods = pods
        self.now = 100.0
        self.tracker = LoadTracker(2.0, lambda: self.now, **tracker)  # type: ignore[arg-type]
        self.tracker.members.drop_after_s = drop_after_s
        self.scraper = Scraper(self.tracker, self.fetch, list(pods), 0.25)

    async def fetch(self, url: str) -> str:
        return self.pods[url].page()

    def round(self, advance_s: float = 0.25) -> bool:
        self.now += advance_s
        return asyncio.run(self.scraper.scrape_once())

    def load(self) -> tuple[bool, float, float, int]:
        """Fresh, queue_ms, capacity, pending of the model."""
        load = self.tracker.snapshot("m")["m"]
        return load.fresh, load.queue_ms, load.capacity, load.pending


def test_a_member_that_goes_away_leaves_the_others_read_and_the_capacity_theirs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: one member's failed scrape failed the whole round, the signals went stale and every
    request stayed home. Now the survivor is read, the load is its own, and capacity halves once the
    grace is over; each change is logged once, not every round."""
    a, b = Pod(queue_ms=400, pending=40), Pod(queue_ms=400, pending=40)
    cluster = Cluster({"http://a/metrics": a, "http://b/metrics": b}, parallelism=4)
    for _ in range(3):
        assert cluster.round()
    assert cluster.load() == (True, 400.0, 4.0, 80)
    caplog.set_level(logging.WARNING, "spillway.signals")
    b.up = False
    assert cluster.round(), "a round with one member answering is a round"
    fresh, queue_ms, capacity, pending = cluster.load()
    assert (fresh, queue_ms, capacity) == (True, 400.0, 4.0), "within its grace the member still counts"
    for _ in range(20):
        assert cluster.round()
    fresh, queue_ms, capacity, pending = cluster.load()
    assert (fresh, queue_ms, capacity, pending) == (True, 400.0, 2.0, 40), cluster.load()
    assert cluster.tracker.members.counts() == {
        MemberState.UP: 1,
        MemberState.FAILING: 0,
        MemberState.DOWN: 1,
        MemberState.WEDGED: 0,
    }
    said = [r.getMessage() for r in caplog.records if "http://b/metrics" in r.getMessage()]
    assert len(said) == 2 and "failed" in said[0] and "dropped" in said[1], said
    b.up = True
    caplog.clear()
    for _ in range(3):
        assert cluster.round()
    assert cluster.load()[2] == 4.0, "taken back once it answers"
    assert [r.getMessage() for r in caplog.records] == ["on-prem member http://b/metrics answers again"]


def test_a_member_that_restarts_starts_a_new_baseline_not_a_negative_delta() -> None:
    a, b = Pod(queue_ms=50), Pod(queue_ms=50)
    cluster = Cluster({"http://a/metrics": a, "http://b/metrics": b})
    for _ in range(3):
        cluster.round()
    b.restart()
    b.queue_ms = a.queue_ms = 50
    for _ in range(2):
        assert cluster.round()
        assert cluster.load()[1] == 50.0


def test_no_member_answering_is_a_failed_round_and_the_signals_go_stale() -> None:
    a = Pod(queue_ms=400, pending=40)
    cluster = Cluster({"http://a/metrics": a})
    cluster.round()
    a.up = False
    assert not cluster.round()
    assert cluster.load()[0], "fresh until stale_after_s"
    for _ in range(10):
        assert not cluster.round()
    assert not cluster.load()[0]


def test_capacity_follows_members_where_each_one_runs_a_known_amount() -> None:
    """``member_parallelism``: an autoscaler going from 2 to 4 members doubles the capacity within a
    round of the new members' first answers, and the estimated wait of the same backlog halves."""
    pods = {f"http://p{i}/metrics": Pod(compute_ms=10, pending=20) for i in range(4)}
    first = list(pods)[:2]
    cluster = Cluster(pods, member_parallelism=2)
    cluster.scraper.urls = first
    for _ in range(3):
        cluster.round()
    assert cluster.load()[2] == 4.0

    def wait_ms() -> float:
        return estimated_latency_ms(cluster.tracker.snapshot("m")["m"], Policy({}, (), ()))

    two = wait_ms()
    cluster.scraper.urls = list(pods)
    cluster.round()
    assert cluster.load()[2] == 8.0 and cluster.load()[3] == 80
    four = wait_ms()
    assert four == pytest.approx(two, rel=0.01), "twice the backlog on twice the capacity: the same wait"
    cluster.scraper.urls = first
    cluster.round()
    assert cluster.load()[2] == 4.0, "a member no longer listed is gone at once"


def test_the_config_reads_member_parallelism_and_the_grace() -> None:
    config = SpillwayConfig.model_validate(
        {
            "local": {
                "endpoints": [{"url": "http://a", "metrics_url": "http://a/metrics"}],
                "member_parallelism": 3,
                "drop_member_after_s": 5,
            }
        }
    )
    state = gateway_state(config)
    assert state.load.member_parallelism == 3 and state.load.members.drop_after_s == 5


_NAMES = st.sampled_from(["nv_inference_request_success", "nv_gpu_utilization", "up", "nv_x:y_total"])
_VALUES = st.one_of(
    st.integers(-(10**12), 10**12).map(str), st.sampled_from(["1.5e3", "+Inf", "-Inf", "0.25"])
)
_LABEL_VALUES = st.text(st.characters(codec="utf-8", exclude_characters="\r"), max_size=12)


@given(
    st.lists(
        st.tuples(
            _NAMES,
            st.dictionaries(st.sampled_from(["model", "version", "gpu_uuid"]), _LABEL_VALUES, max_size=3),
            _VALUES,
            st.booleans(),
        ),
        max_size=12,
    ),
    st.sets(_NAMES),
)
@settings(max_examples=300, deadline=None)
def test_the_rounds_parser_reads_a_page_as_prometheus_client_does(
    lines: list[tuple[str, dict[str, str], str, bool]], counters: set[str]
) -> None:
    """``samples_of`` replaced prometheus_client's parser on the round's path (a quarter of its cost,
    bench/members_round.py); on the exposition format it reads the same samples."""

    def escaped(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    text = []
    for family in sorted({line[0] for line in lines}):
        # Each family's TYPE line before its samples, as an exporter writes them.
        text.append(f"# TYPE {family} {'counter' if family in counters else 'gauge'}")
        for name, labels, value, stamped in lines:
            if name == family:
                inner = ",".join(f'{k}="{escaped(v)}"' for k, v in labels.items())
                text.append(f"{name}{{{inner}}} {value}" + (" 1700000000000" if stamped else ""))
    page = "\n".join(text) + "\n"

    def key(sample: tuple[str, dict[str, str], float]) -> str:
        return repr((sample[0], sorted(sample[1].items()), sample[2]))

    mine = sorted(((s.name, s.labels, s.value) for s in samples_of(page)), key=key)
    families = text_string_to_metric_families(page)
    theirs = sorted(((s.name, s.labels, s.value) for f in families for s in f.samples), key=key)
    assert mine == theirs


def test_a_page_the_parser_cannot_read_fails_that_member_alone() -> None:
    with pytest.raises(ValueError, match="not a metrics sample line"):
        samples_of('nv_inference_request_success{model="m"} 1\nthis is not prometheus\n')
    a, b = Pod(queue_ms=50), Pod(queue_ms=50)
    cluster = Cluster({"http://a/metrics": a, "http://b/metrics": b})
    b.page = lambda per_round=10: "garbage line here\n"  # type: ignore[method-assign]
    for _ in range(3):
        assert cluster.round()
    assert cluster.tracker.members.counts()[MemberState.UP] == 1
