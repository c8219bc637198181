"""Streams of generated tokens in the runner's books. A target's and a tenant's requests in
flight on the ext-plugin route, where the runner learns of answers only from the logger and
counts each dispatch for about as long as answers take: a stream learns its own answer time, so
minutes of stream are not counted for the milliseconds of the target's ``infer`` answers. The
cluster's answer time is until its first byte (a stream's first token), which a model's
first-token target is held against."""

from __future__ import annotations

from gateway_plugin.books import outcomes
from gateway_plugin.books.ledger import streamed
from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.explain import explain
from gateway_plugin.policy.model import Decision, Reason
from testing.gateway import gateway_state

CONFIG = SpillwayConfig.model_validate(
    {
        "targets": [{"name": "aws", "kind": "http", "url": "http://127.0.0.1:9", "concurrency_cap": 2}],
        "tenants": {"quotas": {"t1": {"concurrency": 2}}},
    }
)
SENT = Decision("aws", Reason.OVERFLOW_WARM, tenant="t1")


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _answer(state: GatewayState, uri: str, seconds: float) -> None:
    """What the route's logger reports of one answer from the target."""
    entry = {"status": 200, "upstream_status": "200", "upstream_s": seconds, "uri": uri, "tenant": "t1"}
    entry["target"] = state.route_value("aws")
    outcomes.apply(state, outcomes.read_entries([entry]).entries)


def test_a_long_stream_keeps_its_slot_while_short_answers_come_and_go() -> None:
    clock = Clock()
    state = gateway_state(CONFIG, clock=clock)
    state.commit(SENT, "llm", streamed=True)
    for i in range(50):  # infer answers of 10 ms teach a horizon of about 10 ms
        clock.now = i * 0.1
        state.commit(SENT, "m")
        _answer(state, "/v2/models/m/infer", 0.01)
    clock.now = 20.0
    assert state.snapshot("t1", "m").targets["aws"].in_flight == 1, "the stream still counts"
    assert state.snapshot("t1", "m").tenants["t1"].in_flight == 1, "and holds its tenant's slot"
    _answer(state, "/v2/models/llm/generate_stream", 20.0)
    assert state.snapshot("t1", "m").targets["aws"].in_flight == 0, "its outcome frees it"
    assert state.snapshot("t1", "m").tenants["t1"].in_flight == 0


def test_a_stream_is_known_by_its_path_alone() -> None:
    assert streamed("/v2/models/llm/generate_stream")
    assert streamed("/v2/models/llm/versions/2/generate_stream/?x=1")
    assert not streamed("/v2/models/llm/generate")
    assert not streamed("/v2/models/generate_stream/infer")


def test_a_local_stream_teaches_the_estimate_its_first_token_not_its_length() -> None:
    """The cluster's observed answer time is its time to the first byte: a 30 s generation whose
    first token came after 200 ms says the cluster answers in 200 ms, not that it is 30 s behind."""
    state = gateway_state(CONFIG)
    entry = {
        "status": 200,
        "upstream_status": "200",
        "upstream_s": "30.000",
        "upstream_header_s": "0.200",
        "uri": "/v2/models/llm/generate_stream",
    }
    outcomes.apply(state, outcomes.read_entries([entry]).entries)
    assert state.snapshot(None, "llm").local[""].observed_ms == 200.0


def test_a_models_first_token_target_has_the_latencys_hysteresis_and_lapses_with_its_observations() -> None:
    """``model_ttft_targets_ms: {llm: 500}``: late above 400 ms (overflow's enter ratio 0.8), on
    time again below 350 ms (its exit ratio 0.7), and not late once nothing was seen for
    ``stale_after_s``; the verdict is the thresholds' (both routes read it), the model's alone."""
    clock = Clock()
    state = gateway_state(
        SpillwayConfig.model_validate(
            {
                "local": {"model_ttft_targets_ms": {"llm": 500}, "stale_after_s": 2.0},
                "overflow": {"enter_ratio": 0.8, "exit_ratio": 0.7},
            }
        ),
        clock=clock,
    )

    def late() -> bool:
        return state.snapshot(None, "llm").local["llm"].gauges_hot

    state.answered_local("llm", 450)
    assert late() and not state.snapshot(None, "m").local[""].gauges_hot
    state.answered_local("llm", 100)  # 380 ms: between the two
    assert late()
    state.answered_local("llm", 100)  # 324 ms
    assert not late()
    state.answered_local("llm", 900)
    assert late()
    clock.now = 3.0
    assert not late(), "what was seen 3 s ago says nothing now"


def test_check_config_says_what_a_first_token_target_holds_the_model_to() -> None:
    config = SpillwayConfig.model_validate(
        {
            "local": {"model_ttft_targets_ms": {"llm": 500}},
            "overflow": {"enter_ratio": 0.8, "exit_ratio": 0.7},
        }
    )
    assert (
        "first token of llm: target 500 ms, overflow while the cluster's first bytes average above 400 ms "
        in explain(config)
    )
