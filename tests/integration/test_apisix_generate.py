"""LLM generation through a real Apache APISIX 3.18, on both routes (the ext-plugin route and the
fast path): ``generate_stream``'s events reach the client as the model makes them, from the
on-prem tritonserver and from the function it spills to (the FC server with its own sidecar), a
confidential prompt never leaves, and a stream the client cuts frees its cloud slot.

The model (``tests/model_repository/tokens``) sends its first token and then waits while a
``hold`` file is in its directory: the test reads that token through the whole chain while the
model has not made the second, which no buffering hop lets through."""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway_plugin.config import TargetCost
from gateway_plugin.costs import BYTES_PER_INPUT_TOKEN, request_cost_usd
from testing.apisix import FAST_HOST, needs_apisix, runner_table
from testing.budget import clear_of_the_hours_end
from testing.http import http, settled, wait_until
from testing.llm import FUNCTION_COST, SPILL, USD_PER_PROMPT_TOKEN, USD_PER_TOKEN, running_chain
from testing.sse import EventStream

pytestmark = [pytest.mark.integration, needs_apisix()]

HOSTS = {"ext-plugin": "localhost", "fast": FAST_HOST}
KEY = "generate-test-signing-key-0123456789"

BUDGET = 'spillway_target_spent_usd{target="aws",window="hour"}'

# A stream's price at decision; the tenants of the tenant test may each spend it and a little more
# an hour: one stream reaches the function, and from its decision on the tenant is within a price of
# its quota, so the runner's table carries its books.
PRICE = request_cost_usd(TargetCost.model_validate(FUNCTION_COST))
SETTLED_TENANTS = [f"t-{route}-{how}" for route in HOSTS for how in ("whole", "cut")]
TENANTS = {"quotas": {name: {"hourly_usd": PRICE + 0.0005} for name in SETTLED_TENANTS}}


@dataclass
class Chain:
    url: str
    holds: tuple[Path, ...]  # the on-prem model's and the function's
    onprem_model: Path
    metrics_url: str
    config: dict[str, Any]

    def spend(self, series: str = BUDGET) -> float:
        """What the runner has counted as spent at the function (by default in its hour's budget,
        which a stream's settlement sets to its bill: the spend counter, which only grows, takes
        what an earlier stream gave back off the spend that follows)."""
        _, _, body = http("GET", self.metrics_url)
        found = re.search(rb"^" + re.escape(series.encode()) + rb" (\S+)$", body, re.M)
        return float(found.group(1)) if found else 0.0

    def settled(self, series: str) -> float:
        """``series`` once it stays put: what earlier streams spent comes within about a second."""
        return settled(lambda: self.spend(series))

    def tenant_spent(self, tenant: str) -> float | None:
        """What the runner's books hold as ``tenant``'s spend this hour (None: not in its table)."""
        row = runner_table(self.config)["tenants"].get(tenant)
        return None if row is None else float(row["spent_hour_usd"])

    def stream(
        self,
        route: str,
        classification: str,
        spill: bool,
        tokens: int = 4,
        first_token_ms: float = 0,
        chunked: bool = False,
        tenant: str | None = None,
    ) -> EventStream:
        headers = {"host": HOSTS[route], "x-data-classification": classification}
        if spill:
            headers[SPILL] = "yes"
        if tenant is not None:
            headers["x-tenant"] = tenant
        body = _prompt(tokens, first_token_ms)
        return EventStream(f"{self.url}/v2/models/tokens/generate_stream", body, headers, chunked=chunked)

    def decision(self, route: str, classification: str = "public") -> str:
        with self.stream(route, classification, spill=False, tokens=1) as events:
            events.rest()
            return events.headers.get("x-spillway-decision", "")

    def spills(self, route: str) -> bool:
        """Whether a one-token request marked to spill is answered by the function."""
        with self.stream(route, "public", spill=True, tokens=1) as events:
            return (
                events.headers.get("x-spillway-decision", "").startswith("aws;") and len(events.rest()) == 1
            )

    def spilled(
        self, route: str, tokens: int = 4, chunked: bool = False, tenant: str | None = None
    ) -> EventStream:
        """A stream the function answers: the ext-plugin route frees the target's one slot when the
        previous request's outcome arrives (up to ``outcomes.batch_s`` after its answer)."""
        for _ in range(100):
            events = self.stream(route, "public", spill=True, tokens=tokens, chunked=chunked, tenant=tenant)
            if events.headers.get("x-spillway-decision", "").startswith("aws;"):
                return events
            events.close()
            time.sleep(0.1)
        raise AssertionError(f"no request spilled on the {route} route")


def _prompt(tokens: int, first_token_ms: float = 0) -> bytes:
    prompt = {
        "text_input": "alpha beta gamma delta",
        "max_tokens": tokens,
        "first_token_delay_ms": first_token_ms,
    }
    return json.dumps(prompt).encode()


def _spend_reaches(chain: Chain, before: float, billed: float) -> None:
    """Waits until the budget has taken ``billed`` since ``before``; says what it took if not."""
    try:
        wait_until(lambda: chain.spend() - before >= billed - 1e-9, 20, "the stream settled")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {chain.spend() - before!r} taken of {billed!r}") from None


def _prompt_usd(tokens: int) -> float:
    """What the prompt of a stream asking for ``tokens`` is billed: its body's bytes, 4 a token."""
    return math.ceil(len(_prompt(tokens)) / BYTES_PER_INPUT_TOKEN) * USD_PER_PROMPT_TOKEN


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    work = tmp_path_factory.mktemp("generate")
    with running_chain(work, KEY, 1, tenants=TENANTS, model_ttft_targets_ms={"tokens": 300}) as running:
        made = Chain(
            running.gateway_url,
            (running.onprem_model / "hold", running.cloud_model / "hold"),
            running.onprem_model,
            running.metrics_url,
            running.config,
        )
        for route in HOSTS:
            wait_until(functools.partial(made.spills, route), 30, f"the {route} route spills")
        yield made


@pytest.fixture
def one_hour() -> None:
    """A test that reads what one stream adds to a budget reads it within one hour."""
    clear_of_the_hours_end()


@pytest.fixture
def hold(chain: Chain) -> Iterator[None]:
    """Holds both models' streams after their first token; after the test, waits until the cluster
    is cool again: each try of ``spilled`` that found the function's slot taken went home and was
    held there, and enough of them fill the KV cache past its limit until the runner scrapes them
    gone."""
    for flag in chain.holds:
        flag.touch()
    yield
    for flag in chain.holds:
        flag.unlink(missing_ok=True)
    for route in HOSTS:
        wait_until(functools.partial(_decided, chain, route, "local;"), 30, f"{route}: the cluster cools")


@pytest.mark.parametrize("spill", [False, True], ids=["on-prem", "spilled"])
@pytest.mark.parametrize("route", list(HOSTS))
def test_each_token_reaches_the_client_as_the_model_makes_it(
    chain: Chain, hold: None, route: str, spill: bool
) -> None:
    with chain.spilled(route) if spill else chain.stream(route, "public", spill) as events:
        assert events.status == 200, events.response.read()
        decision = events.headers.get("x-spillway-decision", "")
        assert decision.startswith("aws;" if spill else "local;"), decision
        first = events.next()
        assert first is not None and first["text_output"] == "alpha "
        for flag in chain.holds:
            flag.unlink()
        rest = events.rest()
    assert "".join(str(e["text_output"]) for e in rest) == "beta gamma delta "


@pytest.mark.parametrize("route", list(HOSTS))
def test_a_confidential_prompt_never_leaves(chain: Chain, route: str) -> None:
    with chain.stream(route, "confidential", spill=True) as events:
        decision = events.headers.get("x-spillway-decision", "")
        assert decision.startswith("local;") or events.status == 503, (events.status, decision)


def test_a_stream_cut_by_the_client_frees_its_cloud_slot(chain: Chain, hold: None) -> None:
    """The target's concurrency cap is 1 and the cut stream's model still holds it open (the
    ``hold`` file, 30 s): only a slot freed by the cut lets the next request spill. The fast path
    alone: the ext-plugin route's runner counts a stream in flight for about as long as streams
    usually take (``books.ledger.InFlight``), and this module's other streams are short, so a held
    one stops counting there anyway (``tests/unit/test_streams_in_flight.py`` covers it)."""
    with chain.spilled("fast") as events:
        assert events.next() is not None
    wait_until(lambda: chain.spills("fast"), 20, "the cut stream's slot freed while its model still holds it")


@pytest.mark.parametrize("route", list(HOSTS))
def test_a_spilled_stream_is_billed_the_tokens_it_sent(chain: Chain, one_hour: None, route: str) -> None:
    """The function is priced per token alone, 4 generated and no prompt token expected: a stream
    of 9 is held at 4 while it runs and settled at the events the gateway counted going by and at
    its prompt's tokens (its body's bytes / 4), when it ends (the runner, from the ext-plugin
    route's outcome; the fast path's plugin in its log phase, which the runner learns with the next
    table it fetches)."""
    before = chain.settled(BUDGET)
    with chain.spilled(route, tokens=9) as events:
        sent = [events.next(), *events.rest()]
    assert len(sent) == 9, sent
    billed = 9 * USD_PER_TOKEN + _prompt_usd(9)
    _spend_reaches(chain, before, billed)
    time.sleep(1.5)
    assert chain.spend() - before == pytest.approx(billed)


@pytest.mark.parametrize("route", list(HOSTS))
def test_a_chunked_prompt_is_billed_at_its_body(chain: Chain, one_hour: None, route: str) -> None:
    """A body framed by no Content-Length (chunked; no prompt token is expected at decision) is not
    free: both routes read the body whole before they decide, and nginx then knows its size, so
    ``$content_length`` holds it in the log phase and the prompt is billed at its body's tokens."""
    before = chain.settled(BUDGET)
    with chain.spilled(route, tokens=3, chunked=True) as events:
        sent = [events.next(), *events.rest()]
    assert len(sent) == 3, sent
    billed = 3 * USD_PER_TOKEN + _prompt_usd(3)
    assert _prompt_usd(3) > 0
    _spend_reaches(chain, before, billed)
    time.sleep(1.5)
    assert chain.spend() - before == pytest.approx(billed)


@pytest.mark.parametrize("route", list(HOSTS))
def test_a_stream_cut_by_the_client_gives_back_its_price_less_what_it_sent(
    chain: Chain, one_hour: None, hold: None, route: str
) -> None:
    """Held at 4 tokens' price while it runs, a stream the client cuts after its first token is
    settled at that one token: the target's budget takes 1 token's price (and its prompt's) in all."""
    before = chain.settled(BUDGET)
    with chain.spilled(route) as events:
        assert events.next() is not None
    settled = USD_PER_TOKEN + _prompt_usd(4)
    assert settled < 4 * USD_PER_TOKEN, "what it sent costs less than its price: the test sees the return"
    wait_until(lambda: abs(chain.spend() - before - settled) < 1e-9, 20, "the stream settled")
    assert chain.settled(BUDGET) - before == pytest.approx(settled)


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut"])
@pytest.mark.parametrize("route", list(HOSTS))
def test_a_spilled_streams_tenant_is_billed_what_the_stream_cost(
    chain: Chain, one_hour: None, hold: None, route: str, cut: bool
) -> None:
    """A tenant's hourly quota counts a stream at its price from its decision (the stream held
    after its first token meanwhile), and at its bill once it ends: 9 tokens sent cost more than
    the 4 expected, and a stream cut after its first token less. The fast path's plugin reports the
    tenant's share of the settlement in its summary, signed; the runner settles the ext-plugin
    route's itself."""
    tenant = f"t-{route}-{'cut' if cut else 'whole'}"
    tokens = 4 if cut else 9
    with chain.spilled(route, tokens=tokens, tenant=tenant) as events:
        assert events.next() is not None
        wait_until(lambda: chain.tenant_spent(tenant) == pytest.approx(PRICE), 10, "the price held")
        if not cut:
            for flag in chain.holds:
                flag.unlink()
            assert len(events.rest()) == tokens - 1
    billed = (1 if cut else tokens) * USD_PER_TOKEN + _prompt_usd(tokens)
    assert billed != pytest.approx(PRICE), "the bill differs from the price: the test sees the settlement"
    wait_until(lambda: chain.tenant_spent(tenant) == pytest.approx(billed), 20, "the stream settled")
    time.sleep(1.5)
    assert chain.tenant_spent(tenant) == pytest.approx(billed)


def test_the_kv_cache_past_its_limit_spills_public_prompts_on_both_routes(chain: Chain) -> None:
    """The on-prem model's ``vllm:gpu_cache_usage_perc`` as Triton exports it, read through
    ``local.thresholds.engine: {backend: vllm}`` (80 %): past it, public prompts leave on both
    routes while confidential ones stay; below its exit, they come home."""
    kv_cache = chain.onprem_model / "kv_cache"
    try:
        kv_cache.write_text("0.95")
        for route in HOSTS:
            spills = functools.partial(_decided, chain, route, "aws;")
            wait_until(spills, 30, f"{route}: a full cache spills")
            assert chain.decision(route, "confidential").startswith("local;"), route
    finally:
        kv_cache.unlink(missing_ok=True)
    for route in HOSTS:
        wait_until(
            functools.partial(_decided, chain, route, "local;"), 30, f"{route}: an empty cache keeps it"
        )


def _decided(chain: Chain, route: str, where: str) -> bool:
    return chain.decision(route).startswith(where)


@pytest.mark.parametrize("route", list(HOSTS))
def test_first_tokens_later_than_the_models_target_spill_public_prompts(chain: Chain, route: str) -> None:
    """``local.model_ttft_targets_ms: {tokens: 300}``: confidential prompts whose first token the
    cluster makes after 600 ms (kept home, as they must be) teach the route's runner that the
    model is late, and public ones then leave; once first tokens come fast again, they stay."""

    def slow_first_tokens() -> bool:
        with chain.stream(route, "confidential", spill=False, tokens=1, first_token_ms=600) as events:
            events.rest()
        return chain.decision(route).startswith("aws;")

    def fast_first_tokens() -> bool:
        with chain.stream(route, "confidential", spill=False, tokens=1) as events:
            events.rest()
        return chain.decision(route).startswith("local;")

    wait_until(slow_first_tokens, 60, f"{route}: a late first token spills")
    wait_until(fast_first_tokens, 60, f"{route}: prompt first tokens bring it home")
