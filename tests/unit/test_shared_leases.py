"""The lease, slot and shared-breaker arithmetic alone (no store: plain values; the store's side is
tested against a real Redis in test_shared_state.py)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gateway_plugin.policy.snapshot import BreakerState
from gateway_plugin.shared.leases import Comeback, Lease, SharedBreaker, Slots, usd_units

WALL = 3600 * 100 + 10.0


def lease(limit: int = 1000, block: int = 100, share: int = 3) -> Lease:
    return Lease("target:aws:spend:h", 3600, limit, block, share)


def test_dollars_become_nano_dollars_rounded_up() -> None:
    assert usd_units(1.0) == 1_000_000_000
    assert usd_units(0.0000002) == 200
    assert usd_units(1e-12) == 1, "a cost too small to count still counts"
    assert usd_units(0.0) == 0


def test_a_connected_node_spends_only_what_it_was_leased() -> None:
    held = lease()
    assert held.remaining(WALL, connected=True) == 0
    asked = held.request(WALL)
    assert asked is not None and asked["want"] == 100 and asked["claim"] == 0
    held.granted(held.window, mine=100, total=250)
    assert held.remaining(WALL, connected=True) == 100
    assert held.take(40, WALL) is False, "60 left, more than half a block"
    assert held.take(20, WALL) is True, "40 left: time to ask for the next block"
    assert held.remaining(WALL, connected=True) == 40


def test_away_from_the_store_a_node_adds_its_share_of_what_was_left() -> None:
    held = lease(limit=1000, share=4)
    held.request(WALL)
    held.granted(held.window, mine=100, total=600)
    held.take(30, WALL)
    assert held.remaining(WALL, connected=False) == 100 + (1000 - 600) // 4 - 30
    never_reached = lease(limit=1000, share=4)
    assert never_reached.remaining(WALL, connected=False) == 250, "no round yet: a quarter of the limit"


def test_back_at_the_store_a_node_claims_what_it_spent_alone() -> None:
    held = lease(limit=1000, share=2)
    held.request(WALL)
    held.granted(held.window, mine=100, total=100)
    held.take(300, WALL)
    asked = held.request(WALL)
    assert asked is not None and asked["claim"] == 300, "spent beyond its lease: claimed, not added"


def test_a_lease_made_anew_counts_the_nodes_earlier_claim_as_spent() -> None:
    again = lease(limit=1000, block=100)
    again.request(WALL)
    again.take(10, WALL)
    again.granted(again.window, mine=700, total=900, before=600)
    assert again.spent == 610 and again.remaining(WALL, connected=True) == 90, (
        "what an earlier lease of this node claimed is spent; only the new block is left"
    )
    again.granted(again.window, mine=800, total=1000, before=700)
    assert again.spent == 610, "only the first answer carries an earlier claim"


def test_a_new_window_starts_empty() -> None:
    held = lease()
    held.request(WALL)
    held.granted(held.window, mine=100, total=100)
    held.take(100, WALL)
    assert held.remaining(WALL + 3600, connected=True) == 0
    assert held.spent == 0 and held.leased == 0
    held.granted(held.window - 1, mine=500, total=500)
    assert held.leased == 0, "an answer about the previous window changes nothing"


def test_back_from_alone_a_lease_asks_for_nothing_and_holds_its_share_until_settled() -> None:
    held = lease(limit=1000, block=100, share=4)
    held.request(WALL)
    held.granted(held.window, mine=100, total=600)
    held.take(30, WALL)
    asked = held.request(WALL, back=WALL)
    assert asked is not None and (asked["claim"], asked["want"], asked["hold"]) == (100, 0, 100), (
        "its claim, no block, and the rest of its alone share (100 + 400 / 4) held"
    )
    held.granted(held.window, mine=100, total=700, held=100)
    assert held.remaining(WALL, connected=True) == 200 - 30, "back, it spends its alone share"
    assert held.take(150, WALL) is False, "and asks for no block until settled"
    asked = held.request(WALL)
    assert asked is not None and (asked["claim"], asked["hold"]) == (200, 0), (
        "settled: a block of what is left of its share stays (spent 180, so 200), the hold goes"
    )
    held.granted(held.window, mine=200, total=600, held=0)
    assert held.remaining(WALL, connected=True) == 20 and held.request(WALL) is not None, "low: a block"


def test_a_lease_made_after_the_node_came_back_gets_no_alone_share() -> None:
    made = lease(limit=1000, share=4)
    asked = made.request(WALL, back=WALL - 1)
    assert asked is not None and (asked["claim"], asked["want"], asked["hold"]) == (0, 0, 0)
    assert made.remaining(WALL, connected=True) == 0, "never answered: nothing to spend until settled"


def test_a_store_that_lost_its_data_keeps_a_node_to_what_it_was_leased() -> None:
    held = lease(limit=1000, block=100, share=4)
    held.request(WALL)
    held.granted(held.window, mine=100, total=600)
    held.keep_to_claim()
    assert held.remaining(WALL, connected=True) == 100
    asked = held.request(WALL, back=WALL)
    assert asked is not None and (asked["claim"], asked["want"], asked["hold"]) == (100, 0, 0), (
        "no share of what was left"
    )


def test_a_node_back_settles_once_as_many_nodes_as_share_told_their_claims() -> None:
    way = Comeback(share=3)
    assert not way.away(connected=False), "not yet reached: the first round is no way back"
    assert not way.answered(WALL, away=False, now=5_000, told=1, born=4_000)
    assert way.away(connected=False)
    assert not way.answered(WALL, away=True, now=6_000, told=1, born=4_000)
    assert way.back == WALL and way.asked() == {"since": 6_000, "born": 4_000}
    way.answered(WALL, away=False, now=6_100, told=2, born=4_000)
    assert way.back == WALL, "two of three told since"
    way.answered(WALL, away=False, now=6_200, told=3, born=4_000)
    assert way.back is None and way.asked()["since"] == 0
    assert way.answered(WALL + 1, away=False, now=9_000, told=1, born=8_500), "a store born again"
    assert way.back == WALL + 1 and way.since == 9_000


@given(
    st.integers(1, 10_000),
    st.integers(1, 8),
    st.lists(st.integers(0, 2000), min_size=1, max_size=8),
    st.integers(0, 10_000),
)
def test_nodes_all_alone_never_spend_more_than_the_limit_left(
    limit: int, share: int, leased: list[int], extra: int
) -> None:
    """Leases never exceed the limit; each node alone adds 1/share of what was left, so N nodes cut
    off at once spend at most the limit (each with the same last view of the total)."""
    nodes = [lease(limit=limit, share=share) for _ in range(share)]
    grants, total = [], 0
    for want in (leased * share)[:share]:
        give = max(0, min(want, limit - total))
        grants.append(give)
        total += give
    for node, mine in zip(nodes, grants, strict=True):
        node.roll(WALL)
        node.granted(node.window, mine, total)
    spent = 0
    for node in nodes:
        may = node.remaining(WALL, connected=False)
        node.take(may, WALL)
        spent += may
    assert spent <= limit


def test_slots_connected_and_alone() -> None:
    slots = Slots("target:aws", cap=10, block=2, share=3)
    asked = slots.request(in_flight=0)
    assert asked == {"key": "target:aws", "cap": 10, "want": 2, "busy": 0}
    assert slots.request(in_flight=0) == asked, "unanswered: asked again"
    slots.granted(2, others_busy=5)
    assert slots.request(in_flight=0) is None, "nothing changed"
    assert slots.allowed(together=True) == 2
    assert slots.allowed(together=False) == 3
    assert Slots("t", cap=2, block=1, share=5).allowed(together=False) == 1, "never less than one"
    asked = slots.request(in_flight=9)
    assert asked is not None and asked["want"] == 10, "never more than the cap"


def test_slots_made_anew_fill_no_more_than_the_old_ones_last_asked_for() -> None:
    """A config reload while a round that gives slots back is out: the store may hand them to
    another node as soon as it reads the ask, so the new slots must not fill them meanwhile."""
    old = Slots("target:aws", cap=10, block=2, share=2)
    old.granted(8, 0)
    assert old.request(in_flight=1) == {"key": "target:aws", "cap": 10, "want": 3, "busy": 1}
    assert old.allowed(together=True) == 3
    new = Slots("target:aws", cap=10, block=2, share=2).carry(old)
    assert new.allowed(together=True) == 3


def test_away_a_node_fills_no_more_than_the_least_it_asked_for_since_its_last_answer() -> None:
    """Cap 4, two nodes holding 2 each. This one asks for 1 (idle): the store runs the round,
    the answer is lost, the other takes the slot freed. Away, this one's next ask is its share
    (2), but the store still counts only 1 for it: that is all it may fill."""
    slots = Slots("t", cap=4, block=1, share=2)
    slots.granted(2, 0)
    assert slots.request(in_flight=0) == {"key": "t", "cap": 4, "want": 1, "busy": 0}
    asked = slots.request(in_flight=0, always=True, settling=True)
    assert asked is not None and asked["want"] == 2
    assert slots.allowed(together=False, counted=True) == 1
    assert slots.allowed(together=False) == 2, "forgotten by the store: its share"
    slots.granted(2, 0)
    assert slots.allowed(together=False, counted=True) == 2, "answered: what the store holds"


def test_a_breaker_tripped_here_is_open_before_the_store_knows() -> None:
    shared = SharedBreaker()
    shared.say("open")
    assert shared.state(WALL) is BreakerState.OPEN
    asked = shared.request("aws", WALL, 5, 60, 1, 30)
    assert asked["op"] == "open" and asked["gen"] == 0
    assert shared.granted("open", gen=1, until_ms=int(WALL * 1000) + 5000, cooldown_ms=5000, probes=0)
    assert shared.op is None and shared.state(WALL + 4.9) is BreakerState.OPEN
    assert shared.state(WALL + 5) is BreakerState.HALF_OPEN


def test_probe_tokens_come_from_the_store_and_their_answer_is_told_to_all() -> None:
    shared = SharedBreaker(gen=3, until_ms=int(WALL * 1000) - 1, cooldown_ms=5000)
    assert shared.state(WALL) is BreakerState.HALF_OPEN
    assert shared.request("aws", WALL, 5, 60, 2, 30)["probes"] == 2
    shared.granted(None, gen=3, until_ms=shared.until_ms, cooldown_ms=5000, probes=1)
    shared.dispatched(WALL)
    assert shared.probes == 0 and shared.probes_out == 1
    assert shared.outcome(ok=True)
    assert shared.op == "close" and shared.op_gen == 3
    assert not shared.outcome(ok=True), "no probe out: an ordinary answer"


def test_a_new_generation_voids_the_tokens_of_the_old_one() -> None:
    shared = SharedBreaker(gen=3, until_ms=1, cooldown_ms=5000, probes=1)
    shared.granted(None, gen=4, until_ms=int(WALL * 1000) + 10_000, cooldown_ms=10_000, probes=0)
    assert shared.probes == 0 and shared.state(WALL) is BreakerState.OPEN


ROUND = ("ask", "store", "reply")
BLOCK = 1


@example(
    [(op, 0) for op in (*ROUND, "fill", "fill", "fill", *ROUND, "done", "done", "done", "ask", "fill")]
    + [(op, 0) for op in ("fill", "fill", "store", "reply")]
    + [(op, 1) for op in (*ROUND, *ROUND, "fill", "fill")]
)
@example(
    [(op, 0) for op in (*ROUND, "fill", *ROUND, "fill", *ROUND, "fill", "fill", *ROUND)]
    + [(op, 1) for op in (*ROUND, "fill", "lose", "fill")]
)
@example(  # an idle ask ran, its answer lost: away, the settling ask must not lift the bound
    [(op, 0) for op in (*ROUND, "fill", *ROUND, "done", "ask", "store", "lose", "reply")]
    + [(op, 1) for op in (*ROUND, "fill", *ROUND, "fill", *ROUND, "fill")]
    + [(op, 0) for op in ("ask", "fill", "fill")]
)
@given(st.lists(st.tuples(st.sampled_from(["fill", "done", "lose", *ROUND]), st.integers(0, 1)), max_size=60))
def test_nodes_that_fill_while_their_round_is_out_never_exceed_the_cap(steps: list[tuple[str, int]]) -> None:
    """Two nodes and the store's arithmetic (``shared_store``'s script: a node holds at most
    what the others leave). A round is out for a while: the store may set what a node holds from
    a want asked before the node filled more, so a node must fill no more than it asked for. A
    node may lose the store (``lose``, and again to find it back): its rounds, which then ask for
    its share, may still reach the store, their answers not the node, which fills no more than its
    share and, as the store still counts it, than the least the store may hold for it."""
    cap, nodes = 4, [Slots("t", cap=4, block=BLOCK, share=2), Slots("t", cap=4, block=BLOCK, share=2)]
    in_flight, field, sent, stored = [0, 0], [0, 0], [None, None], [None, None]
    away = [False, False]
    for op, n in steps:
        node = nodes[n]
        if op == "fill" and in_flight[n] < node.allowed(together=not away[n], counted=True):
            in_flight[n] += 1
        elif op == "done" and in_flight[n]:
            in_flight[n] -= 1
        elif op == "lose":
            away[n] = not away[n]
        elif op == "ask" and sent[n] is None and stored[n] is None:
            sent[n] = node.request(in_flight[n], always=True, settling=away[n])
        elif op == "store" and sent[n] is not None:
            asked, sent[n] = sent[n], None
            field[n] = max(0, min(asked["want"], cap - field[1 - n]))
            stored[n] = field[n]
        elif op == "reply" and stored[n] is not None:
            if not away[n]:
                node.granted(stored[n], 0)
            stored[n] = None
        assert sum(in_flight) <= cap, (steps, in_flight, field)
