"""``simulation.generation``: requests that are streamed LLM generations, with prompt and output
lengths from a published trace's distribution. Their SLO is the time to the first token; a function
is billed the whole stream and its tokens, and the runner's books settle each stream at that bill."""

from __future__ import annotations

import random
import statistics
from typing import Any

import pytest

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.costs import answer_cost_usd, request_cost_usd
from gateway_plugin.simulation.cluster import Job
from gateway_plugin.simulation.engine import jobs, replay
from gateway_plugin.simulation.runner_policy import EPOCH, SpillwayRouter
from gateway_plugin.simulation.tokens import TRACES
from gateway_plugin.simulation.trace import RateTrace, Shaping

COST = {
    "usd_per_request": 0.0001,
    "memory_gb": 1,
    "usd_per_gb_second": 0.001,
    "usd_per_output_token": 0.00001,
    "expected_duration_ms": 2000,
    "expected_output_tokens": 100,
    "usd_per_input_token": 0.000001,
    "billed_init": False,
}


def config(**local: Any) -> SpillwayConfig:
    return SpillwayConfig.model_validate(
        {
            "local": {
                "parallelism": 1,
                "latency_target_ms": 60_000,
                "model_ttft_targets_ms": {"llm": 500},
                **local,
            },
            "targets": [
                {"name": "aws", "kind": "http", "url": "http://127.0.0.1:9", "cold_start_ms": 0, "cost": COST}
            ],
            "simulation": {
                "model": "llm",
                "cluster": {"service_cv": 0, "network_ms": 1},
                "targets": {"aws": {"service_cv": 0, "network_ms": 20}},
                "generation": {"prefill_ms_per_1k_tokens": 100, "ms_per_output_token": 10},
            },
        }
    )


@pytest.mark.parametrize("name", list(TRACES))
def test_the_draws_keep_the_published_traces_medians_and_means(name: str) -> None:
    lengths = TRACES[name]
    rng = random.Random(3)
    prompts, outputs = zip(*(lengths.draw(rng) for _ in range(50_000)), strict=True)
    medians = {"azure-conversation": (1020, 129), "azure-code": (1469, 13)}[name]
    assert (statistics.median(prompts), statistics.median(outputs)) == pytest.approx(medians, rel=0.03)
    assert statistics.fmean(prompts) == pytest.approx(lengths.mean_prompt, rel=0.03)
    # The coding outputs' tail (up to 1,899 tokens) is kept by its 99 % and 99.9 % quantiles alone.
    assert statistics.fmean(outputs) == pytest.approx(lengths.mean_output, rel=0.15)


def _one(job: Job, cfg: SpillwayConfig) -> tuple[float, float, SpillwayRouter]:
    router = SpillwayRouter(cfg)
    measures = replay(cfg, router, [job], seed=1)
    return measures.latency_ms[0], sum(measures.cost_by_target.values()), router


def _generation(prompt: int, tokens: int) -> Job:
    job = Job(1.0, 1000, False, 0.0, 0.0)
    prefill, decode = prompt * 0.1, (tokens - 1) * 10.0
    job.tokens, job.base_ms, job.decode_share = tokens, prefill + decode, decode / (prefill + decode)
    job.prompt = prompt
    job.local_ms = job.base_ms
    return job


def test_a_generation_kept_home_is_measured_to_its_first_token() -> None:
    ms, spent, _ = _one(_generation(2000, 300), config())
    assert ms == pytest.approx(200 + 1), "its prefill and the network, not its 3 s of tokens"
    assert spent == 0


def test_a_spilled_generation_is_billed_its_whole_stream_and_tokens_and_the_books_settle_at_that() -> None:
    """A rule sends it out: its first token after the network's half, the prefill and the other
    half; billed 200 ms of prefill and 2,990 ms of tokens, its 300 tokens and its prompt's 2,000;
    the runner's budget book holds what it saw the stream take, not the price at decision."""
    spill = SpillwayConfig.model_validate(
        {**config().model_dump(), "rules": [{"name": "out", "action": "target", "targets": ["aws"]}]}
    )
    ms, spent, router = _one(_generation(2000, 300), spill)
    assert ms == pytest.approx(20 + 200, abs=0.01)  # and a cold start of 1 us (cold_start_ms 0)
    cost = spill.targets[0].cost
    assert spent == pytest.approx(answer_cost_usd(cost, 3.19, 300, 2000))
    seen = answer_cost_usd(cost, 3.21 + 1e-6, 300, 2000)  # as long as the gateway saw it, the network's too
    assert router.state.ledger.spent("target:aws", EPOCH + 10)[0] == pytest.approx(seen)


def test_a_generation_a_function_invoked_answers_whole_and_the_books_price_it_as_one_request() -> None:
    """A function the runner invokes answers when the whole generation is done, so its first byte
    is its last; the runner's books count it as it does, at the price held at decision (an answer,
    not a stream settled at its tokens); the platform bills the stream all the same."""
    made = config().model_dump()
    made["targets"] = [
        {
            "name": "aws",
            "kind": "aliyun_fc",
            "mode": "invoke",
            "function_name": "f",
            "service_name": "s",
            "cold_start_ms": 0,
            "cost": COST,
        }
    ]
    made["rules"] = [{"name": "out", "action": "target", "targets": ["aws"]}]
    invoked = SpillwayConfig.model_validate(made)
    ms, spent, router = _one(_generation(2000, 300), invoked)
    assert ms == pytest.approx(20 + 200 + 2990, abs=0.01), "the whole answer, then the network"
    cost = invoked.targets[0].cost
    assert spent == pytest.approx(answer_cost_usd(cost, 3.19, 300, 2000))
    booked = router.state.ledger.spent("target:aws", EPOCH + 10)[0]
    assert booked == pytest.approx(request_cost_usd(cost)), "priced at decision, as the runner prices it"


def test_the_trace_of_generations_draws_lengths_once_for_every_policy() -> None:
    cfg = config()
    trace = RateTrace((2.0,) * 30)
    first = list(jobs(cfg, trace, Shaping(), 5))
    again = list(jobs(cfg, trace, Shaping(), 5))
    assert [(j.tokens, j.base_ms) for j in first] == [(j.tokens, j.base_ms) for j in again]
    assert all(j.tokens >= 1 and 0 <= j.decode_share < 1 for j in first)
    assert len({j.tokens for j in first}) > 10


def test_generations_follow_the_members_through_a_drain_and_settle_exactly() -> None:
    """Members that change: two pods, one drained at 100 s, back at 200 s. The first-token target
    spills more of what may leave while one pod serves and less once both do again, keeps every
    on-prem-only generation home, and the runner's books settle each stream at what the gateway
    saw it cost (the bill plus the network's part of each stream, 20 ms here)."""
    cfg = SpillwayConfig.model_validate(
        {
            **config(member_parallelism=4).model_dump(exclude={"simulation"}),
            "simulation": {
                **config().simulation.model_dump(),
                "members": 2,
                "membership": [{"at_s": 100, "members": 1}, {"at_s": 200, "members": 2}],
            },
        }
    )
    arrivals = list(jobs(cfg, RateTrace((2.5,) * 300), Shaping(confidential_share=0.2), 7))
    router = SpillwayRouter(cfg)
    measures = replay(cfg, router, arrivals, seed=1)

    def cloud_share(start: float, end: float) -> float:
        kinds = [k for at, k in zip(measures.at, measures.kinds, strict=True) if start <= at < end]
        return kinds.count(1) / len(kinds)

    both, drained, back = cloud_share(20, 100), cloud_share(120, 200), cloud_share(240, 300)
    assert drained > both + 0.1 and drained > back + 0.1, (both, drained, back)
    assert measures.residency_breaches == 0
    assert len(measures.kinds) == len(arrivals) and set(measures.kinds) <= {0, 1}
    bill = measures.cost_by_target["aws"]
    streams = measures.kinds.count(1)
    seen = router.state.ledger.spent("target:aws", EPOCH + 400)[0]
    network = streams * 0.020 * COST["usd_per_gb_second"] * COST["memory_gb"]
    assert bill <= seen <= bill + network * 1.01, (bill, seen, network)
