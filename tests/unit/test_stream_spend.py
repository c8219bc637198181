"""A stream of generated tokens, billed: priced at decision as ``expected_duration_ms`` and
``expected_output_tokens`` say, held at that price in the budgets while it runs, and settled when
its outcome comes with what it really took (the upstream's seconds, the events the edge counted).
The spend metrics count it once, at its end; an answer whose outcome names no tokens is billed the
expected ones."""

from __future__ import annotations

import pytest

from gateway_plugin.books import outcomes
from gateway_plugin.books.ledger import HeldPrices
from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.costs import answer_cost_usd, input_tokens, request_cost_usd
from gateway_plugin.explain import explain
from gateway_plugin.policy.model import Decision, Reason
from testing.gateway import gateway_state

COST = {
    "usd_per_request": 0.001,
    "memory_gb": 1,
    "usd_per_gb_second": 0.01,
    "usd_per_gpu_second": 0,
    "expected_duration_ms": 2000,
    "expected_output_tokens": 100,
    "usd_per_output_token": 0.0001,
}
CONFIG = SpillwayConfig.model_validate(
    {
        "targets": [{"name": "aws", "kind": "http", "url": "http://127.0.0.1:9", "cost": COST}],
        "tenants": {"quotas": {"t1": {"hourly_usd": 5}}},
        "local": {"model_ttft_targets_ms": {"llm": 500}},  # a model the cost series names
    }
)
PRICE = 0.001 + 2 * 0.01 + 100 * 0.0001
STREAM = "/v2/models/llm/generate_stream"


def _sent(state: GatewayState, model: str, streamed: bool) -> None:
    state.commit(Decision("aws", Reason.OVERFLOW_WARM, tenant="t1", cost_usd=PRICE), model, streamed=streamed)


def _answer(
    state: GatewayState, uri: str, seconds: float, tokens: int | None = None, tenant: str = "t1", **extra: str
) -> None:
    """An outcome from the edge; ``extra``: more of its fields (the instance, its cold flag)."""
    entry: dict[str, object] = {
        "status": 200,
        "upstream_status": "200",
        "upstream_s": seconds,
        "uri": uri,
        "tenant": tenant,
        "target": state.route_value("aws"),
        **extra,
    }
    if tokens is not None:
        entry["tokens"] = tokens
    outcomes.apply(state, outcomes.read_entries([entry]).entries)


def _spent(state: GatewayState) -> tuple[float, float, float]:
    """The target's budget, the tenant's and the spend metric."""
    wall = state.wall()
    book = state.tenants.get("t1")
    assert book is not None
    return (
        state.ledger.spent("target:aws", wall)[0],
        book.spent(wall)[0],
        state.metrics.spend.labels("aws")._value.get(),
    )


def test_the_price_at_decision_is_the_expected_answer_and_its_tokens() -> None:
    cost = CONFIG.targets[0].cost
    assert request_cost_usd(cost) == pytest.approx(PRICE)
    assert answer_cost_usd(cost, 2.0004, 100) == pytest.approx(0.001 + 2.001 * 0.01 + 0.01), "ms rounded up"


def test_a_stream_is_held_at_its_price_and_settled_at_what_it_took() -> None:
    state = gateway_state(CONFIG)
    _sent(state, "llm", streamed=True)
    assert _spent(state) == pytest.approx((PRICE, PRICE, 0.0)), "held in the budgets, not yet counted"
    _answer(state, STREAM, 30.0, tokens=900)
    bill = 0.001 + 30 * 0.01 + 900 * 0.0001
    assert _spent(state) == pytest.approx((bill, bill, bill))
    _sent(state, "llm", streamed=True)
    _answer(state, STREAM, 0.5, tokens=3)  # cut early: less than its price, given back
    short = 0.001 + 0.5 * 0.01 + 3 * 0.0001
    assert _spent(state) == pytest.approx((bill + short, bill + short, bill + short))


def test_a_stream_whose_outcome_names_no_tokens_is_billed_the_expected_ones() -> None:
    state = gateway_state(CONFIG)
    _sent(state, "llm", streamed=True)
    _answer(state, STREAM, 4.0)
    bill = 0.001 + 4 * 0.01 + 100 * 0.0001
    assert _spent(state) == pytest.approx((bill, bill, bill))


def test_an_answer_that_is_not_a_stream_is_counted_at_its_price_once() -> None:
    state = gateway_state(CONFIG)
    _sent(state, "m", streamed=False)
    _answer(state, "/v2/models/m/infer", 9.0, tokens=7)
    assert _spent(state) == pytest.approx((PRICE, PRICE, PRICE))


def test_the_cost_series_counts_a_stream_once_with_its_tenant_and_model() -> None:
    state = gateway_state(CONFIG)
    _sent(state, "llm", streamed=True)
    _answer(state, STREAM, 10.0, tokens=50)
    samples = {
        (s.labels["tenant"], s.labels["model"], s.labels["target"], s.name): s.value
        for family in state.metrics.cost.spend.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }
    requests = {
        (s.labels["tenant"], s.labels["model"]): s.value
        for family in state.metrics.cost.requests.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }
    bill = 0.001 + 10 * 0.01 + 50 * 0.0001
    assert samples == {("t1", "llm", "aws", "spillway_spend_usd_total"): pytest.approx(bill)}
    assert requests == {("t1", "llm"): 1.0}


def test_a_streams_prompt_is_held_at_the_expected_tokens_and_settled_at_its_bodys() -> None:
    """Priced per prompt token too: held at ``expected_input_tokens`` (200) while it runs, settled
    at the body's bytes / 4 (a 1,001-byte body: 251 tokens) when its outcome names the body's size,
    and at the expected ones when it does not (a chunked body)."""
    priced = {**COST, "usd_per_input_token": 0.00001, "expected_input_tokens": 200}
    config = SpillwayConfig.model_validate(
        {**CONFIG.model_dump(), "targets": [{**CONFIG.targets[0].model_dump(), "cost": priced}]}
    )
    held = PRICE + 200 * 0.00001
    assert request_cost_usd(config.targets[0].cost) == pytest.approx(held)
    assert input_tokens(1001) == 251 and input_tokens(None) is None
    state = gateway_state(config)
    state.commit(Decision("aws", Reason.OVERFLOW_WARM, tenant="t1", cost_usd=held), "llm", streamed=True)
    entry = {"status": 200, "upstream_status": "200", "upstream_s": 30.0, "uri": STREAM, "tenant": "t1"}
    entry |= {"target": state.route_value("aws"), "tokens": 900, "body_bytes": "1001"}
    outcomes.apply(state, outcomes.read_entries([entry]).entries)
    bill = 0.001 + 30 * 0.01 + 900 * 0.0001 + 251 * 0.00001
    assert _spent(state) == pytest.approx((bill, bill, bill))
    state.commit(Decision("aws", Reason.OVERFLOW_WARM, tenant="t1", cost_usd=held), "llm", streamed=True)
    outcomes.apply(state, outcomes.read_entries([{**entry, "body_bytes": None}]).entries)
    chunked = 0.001 + 30 * 0.01 + 900 * 0.0001 + 200 * 0.00001
    assert _spent(state) == pytest.approx((bill + chunked,) * 3)


@pytest.mark.parametrize(("held_cold", "answered_cold"), [(False, True), (True, False)])
def test_a_stream_settles_against_the_price_its_decision_held(held_cold: bool, answered_cold: bool) -> None:
    """The decision holds a warm or a cold price as it saw the target's instances; the answer's
    instance may say otherwise (a warm one recycled, a cold one that another request warmed). The
    budgets must end at the bill either way: settling against a price rebuilt from the answer's
    cold flag left them short (or over) by the cold start's billed init every time the two differ."""
    cost = CONFIG.targets[0].cost
    cold_start_ms = CONFIG.targets[0].cold_start_ms
    held = request_cost_usd(cost, held_cold, cold_start_ms)
    assert held != request_cost_usd(cost, answered_cold, cold_start_ms)
    state = gateway_state(CONFIG)
    reason = Reason.OVERFLOW_COLD if held_cold else Reason.OVERFLOW_WARM
    state.commit(Decision("aws", reason, tenant="t1", cost_usd=held), "llm", streamed=True)
    _answer(state, STREAM, 8.0, tokens=40, cold="1" if answered_cold else "0", instance="i-1")
    bill = 0.001 + 8 * 0.01 + 40 * 0.0001
    assert _spent(state) == pytest.approx((bill, bill, bill))


def test_streams_of_two_tenants_settle_against_their_own_held_prices() -> None:
    """Outcomes name no decision: each takes the oldest price held for its own tenant, so a tenant's
    budget ends at its own bills whichever stream ends first."""
    config = SpillwayConfig.model_validate(
        {**CONFIG.model_dump(), "tenants": {"quotas": {"t1": {"hourly_usd": 5}, "t2": {"hourly_usd": 5}}}}
    )
    cost, cold_start_ms = config.targets[0].cost, config.targets[0].cold_start_ms
    state = gateway_state(config)
    cold, warm = request_cost_usd(cost, True, cold_start_ms), request_cost_usd(cost)
    state.commit(Decision("aws", Reason.OVERFLOW_COLD, tenant="t2", cost_usd=cold), "llm", streamed=True)
    state.commit(Decision("aws", Reason.OVERFLOW_WARM, tenant="t1", cost_usd=warm), "llm", streamed=True)
    _answer(state, STREAM, 1.0, tokens=10, cold="1", instance="i-1")
    wall = state.wall()
    books = {name: state.tenants.get(name) for name in ("t1", "t2")}
    assert all(book is not None for book in books.values())
    spent = {name: book.spent(wall)[0] for name, book in books.items() if book is not None}
    assert spent == pytest.approx({"t1": 0.001 + 1 * 0.01 + 10 * 0.0001, "t2": cold})


@pytest.mark.parametrize(
    ("held_at", "settled_at", "windows_rolled"), [(3599.0, 3601.0, "hour"), (86399.0, 86401.0, "day")]
)
def test_a_stream_held_in_a_window_gone_gives_nothing_back_to_the_window_now(
    held_at: float, settled_at: float, windows_rolled: str
) -> None:
    """A stream held at its price before the hour (or the day) rolled, settled below it after: the
    window it was held in is gone, and what it cost less must not come off the spend of the window
    now, which would then let through more than its budget."""
    clock = {"now": held_at}
    state = gateway_state(CONFIG, clock=lambda: clock["now"], wall=lambda: clock["now"])
    for _ in range(10):
        _sent(state, "llm", streamed=True)
    clock["now"] = settled_at
    for _ in range(20):
        _sent(state, "llm", streamed=False)
    for _ in range(10):
        _answer(state, STREAM, 0.5, tokens=5)
    bill = 0.001 + 0.5 * 0.01 + 5 * 0.0001
    hour, day = state.ledger.spent("target:aws", settled_at)
    book = state.tenants.get("t1")
    assert book is not None
    assert hour == pytest.approx(20 * PRICE), "the hour now is spent at its own requests"
    assert book.spent(settled_at)[0] == pytest.approx(20 * PRICE)
    if windows_rolled == "hour":
        assert day == pytest.approx(20 * PRICE + 10 * bill), "the day still held them: settled there"
    else:
        assert day == pytest.approx(20 * PRICE)


def test_a_stream_settled_without_its_held_price_gives_nothing_back() -> None:
    """A stream this process never held (it started before, or past the bounds) has no window its
    price is known to be in: what it cost more is spent, what it cost less comes off nothing."""
    state = gateway_state(CONFIG)
    for _ in range(3):
        _sent(state, "llm", streamed=False)
    _answer(state, STREAM, 0.5, tokens=5)
    assert _spent(state)[:2] == pytest.approx((3 * PRICE, 3 * PRICE))
    _answer(state, STREAM, 30.0, tokens=500)
    more = 0.001 + 30 * 0.01 + 500 * 0.0001 - PRICE
    assert _spent(state)[:2] == pytest.approx((3 * PRICE + more,) * 2)


def test_held_prices_are_bounded_and_lapse_with_the_budgets_window() -> None:
    """Streams whose outcome never comes cannot grow the runner's memory: at most ``limit`` prices
    are held, and one older than the hour's window is gone."""
    held = HeldPrices(ttl_s=3600, limit=3)
    for i in range(5):
        held.hold(float(i), "t1", float(i), 1000.0 + i)
    assert len(held.held) == 3
    assert held.take(4.0, "t1") == (2.0, 1002.0), "the oldest kept, with the wall time it was held at"
    assert held.take(4.0, "t2") is None
    assert held.take(3604.5, "t1") is None, "past the window"
    assert not held.held


def test_check_config_warns_of_tokens_priced_but_none_expected() -> None:
    """Prompt tokens priced with none expected: a stream is held at less than it costs while it
    runs. check-config says so for that kind of token only, and names the key to set."""
    priced = {**COST, "usd_per_input_token": 0.00001}
    config = SpillwayConfig.model_validate(
        {**CONFIG.model_dump(), "targets": [{**CONFIG.targets[0].model_dump(), "cost": priced}]}
    )
    warnings = [line for line in explain(config).splitlines() if "warning" in line]
    assert len(warnings) == 1 and "cost.expected_input_tokens is 0" in warnings[0], warnings
    assert not [line for line in explain(CONFIG).splitlines() if "warning" in line]
