"""No operator pattern can stall a request path, on a real Apache APISIX 3.18, on both routes.

Operator patterns that a backtracking engine takes seconds or hours on (``(?s)BEGIN.*?END.*?SIG``,
``(a+)+$``, ``(.*a){20}``) read bodies made to make them backtrack, while a bystander client sends
plain requests to the same route: every bystander request is answered (no 503, none held for
seconds), the runner is not restarted, and each attack request is decided by what its text
holds (a match keeps it home, clean text leaves) or, where its scan ran over
``content.scan_budget_ms``, kept home and counted as ``over_budget`` (test_apisix_content_budget).
"""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import re2

from testing.apisix import Stack, StackStarter, content_routes, needs_apisix
from testing.http import http, wait_until

pytestmark = [pytest.mark.integration, needs_apisix()]

FAST = "/v2/models/add_sub/infer"
EXT = "/v2/models/add_sub/versions/1/infer"
PATHS = {"ext-plugin": EXT, "fast-path": FAST}
PATTERNS = {"sig": r"(?s)BEGIN.*?END.*?SIG", "nested": r"(a+)+$", "twenty": r"(.*a){20}"}
KIB64 = 65536
# Each text, and what makes a backtracking engine slow on it.
ATTACKS = {
    # 16 KB of BEGIN END: Python's re backtracks for about 43 s.
    "begin-end": "BEGIN END " * 1640,
    # (a+)+$ over a run of a's that does not end the text.
    "nested": "a" * (KIB64 - 1) + "b",
    # (.*a){20} where 19 a's are all there is: PCRE's JIT spends seconds before its match limit.
    "nineteen": "a" * 19 + "b" * (KIB64 - 19),
    # Lines of 15 a's: no start position reaches the match limit, each costs a good part of it.
    "lines": ("a" * 15 + "\n") * (KIB64 // 16),
    # Twenty a's and more: (.*a){20} matches.
    "matching": "a" * KIB64,
}
ATTACKERS = 4  # attack requests sent at once
# Far over what a plain request takes on a machine that is not stalled; an event loop or nginx
# worker held by a scan holds every request behind it for seconds.
BYSTANDER_BOUND_S = 5.0


def content_stack(starter: StackStarter, content: dict[str, Any]) -> Stack:
    """A ``Stack`` whose routes both ask for content checks, with this ``content:`` section."""
    config = {**starter.stand_ins.config(), "content": content}
    return starter(config, content_routes(config, FAST), fast_path=True, attr={"stale_after_s": 0.5})


@pytest.fixture(scope="module")
def stack(module_apisix_stack: StackStarter) -> Stack:
    return content_stack(module_apisix_stack, {"patterns": PATTERNS, "max_scan_bytes": 2 * KIB64})


def inference(*texts: str) -> bytes:
    tensor = {"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}
    return json.dumps({"inputs": [tensor]}).encode()


def post(stack: Stack, path: str, body: bytes) -> tuple[int, str, float]:
    """The status, the decision and how long the answer took."""
    headers = {"content-type": "application/json", "x-data-classification": "public"}
    started = time.monotonic()
    status, answer_headers, _ = http("POST", stack.gateway.url + path, body, headers, timeout=60)
    return status, answer_headers.get("x-spillway-decision", ""), time.monotonic() - started


@dataclass
class Bystander:
    """A client sending plain requests to one route until stopped: each one's status and time."""

    stack: Stack
    path: str
    answers: list[tuple[int, str, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.answers.append(post(self.stack, self.path, inference("what is the capital of France?")))
            except OSError as exc:  # no answer at all
                self.answers.append((0, repr(exc), 60.0))

    def p99_s(self) -> float:
        times = sorted(t for _, _, t in self.answers)
        return times[min(len(times) - 1, int(0.99 * len(times)))]


def counted(stack: Stack, family: str, label: str) -> float:
    found = re.search(rf"{family}\{{{label}\}} ([0-9.e+]+)", stack.metrics())
    return float(found.group(1)) if found else 0.0


def _counts(stack: Stack) -> dict[str, float]:
    counts = {
        name: counted(stack, "spillway_content_matches_total", f'detector="{name}"') for name in PATTERNS
    }
    counts["over_budget"] = counted(stack, "spillway_content_unscannable_total", 'reason="over_budget"')
    return counts


def _finds(text: str) -> str | None:
    """The first pattern that matches the text, as RE2 reads it (the only engine that always answers)."""
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    found = (n for n, p in PATTERNS.items() if re2.compile(p.encode(), options).search(text.encode()))
    return next(found, None)


@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.parametrize("kind", list(PATHS))
def test_a_pattern_that_backtracks_stalls_no_request_on_either_route(
    stack: Stack, kind: str, attack: str
) -> None:
    path, text = PATHS[kind], ATTACKS[attack]
    stack.set_load(500)
    runners = stack.gateway.runner_pids()
    before = _counts(stack)
    bystander = Bystander(stack, path)
    thread = threading.Thread(target=bystander.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(bystander.answers) >= 3, 30, "the bystander's first answers")
        with ThreadPoolExecutor(ATTACKERS) as pool:
            attacks = list(pool.map(lambda _: post(stack, path, inference(text)), range(ATTACKERS)))
        seen = len(bystander.answers)
        wait_until(lambda: len(bystander.answers) >= seen + 3, 30, "the bystander's answers after the attack")
    finally:
        bystander.stop.set()
        thread.join(70)
    print(
        f"{kind}, {attack}: bystander {len(bystander.answers)} requests, "
        f"p99 {bystander.p99_s() * 1000:.1f} ms, "
        f"attacks answered in {max(t for _, _, t in attacks) * 1000:.0f} ms at most"
    )
    failed = [a for a in bystander.answers if a[0] != 200]
    assert not failed, f"{len(failed)} of {len(bystander.answers)} bystander requests failed: {failed[:3]}"
    held = [round(t, 2) for _, _, t in bystander.answers if t > BYSTANDER_BOUND_S]
    assert not held, f"bystander requests held for seconds: {held}"
    assert stack.gateway.runner_pids() == runners, "the runner was restarted"
    assert all(status == 200 for status, _, _ in attacks), attacks
    found = _finds(text)
    home = [d for _, d, _ in attacks if d == "local;residency"]
    assert all(d == "local;residency" or (found is None and d.startswith("aws;")) for _, d, _ in attacks), (
        attacks
    )

    # Every one kept home is counted: as the pattern it matched, or as a scan over its budget.
    # (The fast path's counts reach the runner with the plugin's next table fetch.)
    def counted() -> bool:
        now = _counts(stack)
        matched = now[found] - before[found] if found else 0.0
        return matched + now["over_budget"] - before["over_budget"] == len(home)

    wait_until(counted, 10, f"the {len(home)} requests kept home counted")
    assert found is None or len(home) == ATTACKERS, (found, attacks)
