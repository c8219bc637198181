"""Operators' content patterns: the one syntax both paths read (``content_syntax``), refused at
config load with the construct and where it is named; RE2 and the program the fast path runs
(``content_program``, simulated here by ``tests/content_program_vm``) agreeing on random patterns
and texts; and a scan's CPU budget (``content.scan_budget_ms``) in the runner."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_plugin.config import ConfigError, SpillwayConfig, parse
from gateway_plugin.content.checks import Unscannable, Verdict, body_verdict, content_policy
from gateway_plugin.content.detectors import CHECK_BYTES, Budget, OverBudget, pattern_detector
from gateway_plugin.content.program import MAX_PROGRAM, program
from gateway_plugin.content.syntax import NotPortable, check
from tests import content_cases
from tests.content_program_vm import prefilter_holds, search

LATIN1 = re2.Options()
LATIN1.encoding = re2.Options.Encoding.LATIN1


def _re2_finds(pattern: str, text: bytes) -> bool:
    return re2.compile(pattern.encode(), LATIN1).search(text) is not None


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(?=secret)", "lookaround"),
        ("(?<![0-9])7{3}", "lookaround"),
        ("a(?!b)", "lookaround"),
        ("[[:alpha:]]+", "POSIX class"),
        ("a{,3}", "not a quantifier"),
        (r"secret\Z", r"\Z"),
        (r"\v", r"\v"),
        ("a++", "possessive"),
        ("a{2}+", "possessive"),
        ("(?P<n>x)", "group of the form"),
        ("(?i:x)", "group of the form"),
        ("a(?i)b", "group of the form"),
        (r"(x)\1", r"\1"),
        (r"[\d-z]", "range"),
        ("[z-a]", "end comes before its start"),
        ("é+", "quantifier after"),
        ("[é]", "inside a class"),
        ("x|", "empty text"),
        ("a*", "empty text"),
        (r"\B", "empty text"),
        ("(unclosed", "never closed"),
        ("closed)", "no '('"),
        ("[abc", "never closed"),
        ("a{1001}", "over 1000"),
        ("a{3,2}", "m below n"),
        ("(?:a{2}){501}", "multiply past 1000"),
        ("^*", "nothing to repeat"),
        (r"\bx\b+", "nothing to repeat"),
        ("a**", "nothing to repeat"),
        (r"\x4", "two hex digits"),
        ("[a&&b]", "'&&' inside a class"),
        ("[]a]", "']' first"),
        ("abc\\", "trailing backslash"),
        ("(?:[0-9]{10}){100}x", "too large"),
    ],
)
def test_a_pattern_outside_the_syntax_is_refused_at_load_naming_the_construct(pattern: str, why: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse({"content": {"patterns": {"mine": pattern}}})
    message = str(refused.value)
    assert "content.patterns" in message and "pattern 'mine'" in message and why in message, message


def test_a_refusal_says_where_the_construct_is() -> None:
    with pytest.raises(NotPortable, match=r"lookaround.*at character 5"):
        check("EMP-(?=[0-9])")


@pytest.mark.parametrize(
    "pattern",
    [
        "EMP-[0-9]{6}",
        r"(?i)\bproject-[a-f0-9]{8}\b",
        r"[^\x00-\x7f]{2}",
        r"(?s)BEGIN.*?END.*?SIG",
        "(a+)+$",
        "(.*a){20}",
        r"\d{998}",
        r"(?m)^z\z",
        "é(?:é)+",
        "(?:(?:ab){5}){10}",
        r"a[^\x00-\xff]",
    ],
)
def test_patterns_in_the_syntax_compile_for_both_paths(pattern: str) -> None:
    detector = pattern_detector("mine", pattern)
    assert detector.regex is not None and detector.program == program(pattern).encoded()
    SpillwayConfig.model_validate({"content": {"patterns": {"mine": pattern}}})


# Where Python's re, PCRE and RE2 part, the syntax reads as RE2 does, and so does the program.
@pytest.mark.parametrize(
    ("pattern", "text", "found"),
    [
        ("plan$", b"plan\n", False),  # $ is the end of the text, not before a final newline
        ("(?m)plan$", b"plan\n", True),
        (r"a\sb", b"a\x0bb", False),  # \s leaves out \v
        (r"a\Sb", b"a\x0bb", True),
        (r"(?m)\n^", b"a\n", True),  # ^ after a final newline
        (r"(?i)\xc0", b"\xe0", False),  # (?i) folds ASCII only
        ("(?i)é", "É".encode(), False),
        ("(?i)[^a]", b"A", False),
        (r"\w", "é".encode(), False),
        (r"x\b", "xé".encode(), True),
        (".", b"\n", False),
        ("(?s).", b"\n", True),
        (r"\Aok", b"no\nok", False),
        (r"(?m)^ok", b"no\nok", True),
        ("(a+)+$", b"a" * 100 + b"b", False),
        ("(.*a){20}", b"a" * 20, True),
    ],
)
def test_the_syntax_means_what_re2_reads(pattern: str, text: bytes, found: bool) -> None:
    assert _re2_finds(pattern, text) is found
    assert search(program(pattern), text) is found


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_re2_and_the_fast_paths_program_find_the_same_on_random_patterns(seed: int) -> None:
    """Random patterns of the syntax over a small alphabet, random texts: RE2 (the runner) and the
    program (the fast path's automaton) match the same texts, and RE2 compiles every pattern the
    syntax accepts. One the syntax refuses as matching the empty text does match it in RE2."""
    rng = random.Random(seed)
    pattern = content_cases.random_pattern(rng)
    try:
        compiled = program(pattern)
    except NotPortable as refused:
        assert "empty text" not in str(refused) or _re2_finds(pattern, b""), pattern
        return
    regex = re2.compile(pattern.encode(), LATIN1)
    for _ in range(20):
        text = content_cases.random_text(rng).encode()
        found = regex.search(text) is not None
        assert found == search(compiled, text), (pattern, text)
        # What the plugin looks for first is in every text that matches.
        assert not found or prefilter_holds(compiled, text), (pattern, text, compiled.prefilter)


@pytest.mark.parametrize(
    ("pattern", "first"),
    [
        ("EMP-[0-9]{6}", "EMP-" + "0" * 6),
        (r"(?i)\bproject-[a-f0-9]{8}\b", "Project-" + "a" * 8),
        ("(?s)BEGIN.*?END.*?SIG", "BEGIN"),
        ("(?:ab)+x", "ab"),
        (r"\b[A-Z]{2}[0-9]{7}\b", "AB1234567"),
        ("x?yz|yzw", ""),
        (".+", ""),
    ],
)
def test_the_program_carries_byte_sets_every_match_holds_in_a_row(pattern: str, first: str) -> None:
    compiled = program(pattern)
    assert len(compiled.prefilter) == len(first)
    assert first == "" or prefilter_holds(compiled, first.encode())
    assert not prefilter_holds(compiled, first.encode()[1:]) or first == ""


def test_a_program_is_at_most_max_program_steps() -> None:
    assert len(program("[0-9]{998}").code) <= MAX_PROGRAM
    with pytest.raises(NotPortable, match="too large"):
        program("[0-9]{999}x{2}")


def _body(*texts: str) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": list(texts)}]}
    ).encode()


def _clock(step: float) -> Callable[[], float]:
    """A CPU clock that moves ``step`` seconds each time it is read."""
    now = [0.0]

    def read() -> float:
        now[0] += step
        return now[0]

    return read


def test_the_budget_looks_at_the_clock_once_per_check_bytes() -> None:
    budget = Budget(0.5, _clock(1.0))  # deadline 1.5
    budget.read(CHECK_BYTES - 1)  # not looked at
    with pytest.raises(OverBudget):
        budget.read(1)  # looked at: 2.0


def test_a_scan_over_its_budget_stays_home_whatever_unscannable_says() -> None:
    patterns = {"emp": "EMP-[0-9]{6}"}
    config = {"detectors": [], "patterns": patterns, "scan_budget_ms": 5, "unscannable": "as_labelled"}
    content = content_policy(SpillwayConfig.model_validate({"content": config}))
    assert content.budget_s == 0.005
    # The clock moves 2 ms a look: the budget starts at 2, the body is read at 4, the first text
    # at 6, the second at 8: past the 5 ms.
    texts = ["x" * CHECK_BYTES] * 4
    over = Verdict(unscannable=Unscannable.OVER_BUDGET)
    assert body_verdict(content, _body(*texts), None, _clock(0.002)) == over
    assert content.keeps_home(over) and over.label == "unscannable:over_budget"
    assert body_verdict(content, _body(*texts), None, _clock(0.0)) == Verdict()
    # What is found before the budget is spent is found; a short body is read whole.
    found = body_verdict(content, _body("EMP-123456" + "".join(texts)), None, _clock(0.002))
    assert found == Verdict("emp")
    assert body_verdict(content, _body("short"), None, _clock(1.0)) == Verdict()


def test_re2_stays_linear_where_a_backtracking_engine_does_not() -> None:
    """The runner's side of the attack test, without APISIX: each of these takes Python's re
    seconds to hours; RE2 answers (the bound is far above what it takes, and far below those)."""
    cases = [
        (r"(?s)BEGIN.*?END.*?SIG", "BEGIN END " * 1640),
        ("(a+)+$", "a" * 65535 + "b"),
        ("(.*a){20}", "a" * 19 + "b" * 65517),
    ]
    for pattern, text in cases:
        config = SpillwayConfig.model_validate(
            {"content": {"detectors": [], "patterns": {"p": pattern}, "max_scan_bytes": 131072}}
        )
        started = time.monotonic()
        assert body_verdict(content_policy(config), _body(text), None) == Verdict()
        assert time.monotonic() - started < 5, pattern
