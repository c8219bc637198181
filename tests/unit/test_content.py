"""Residency by content, in the runner's own terms: the detectors, the patterns operators may write,
and the promise that a match only ever keeps a request home (hypothesis over random configs,
snapshots, routes and bodies). The Lua plugin is held to the same in test_fast_path_equivalence."""

from __future__ import annotations

import json
import random
import re
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.contract import PathError
from gateway_plugin.cli import main
from gateway_plugin.config import ConfigError, SpillwayConfig, parse
from gateway_plugin.content.checks import content_policy, tightened
from gateway_plugin.content.detectors import (
    BUILT_IN,
    CARD_RUN,
    CARD_SEPARATOR,
    EMAIL,
    PHONE,
    built_in,
    card,
    email,
    first_found,
    iban,
    luhn,
    phone,
)
from gateway_plugin.content.program import program
from gateway_plugin.explain import explain
from gateway_plugin.fast_path import table as decision_table
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.snapshot import RequestFeatures
from testing.paths import ROOT
from tests import content_cases
from tests.content_cases import CARD_SEPARATORS
from tests.fast_path_cases import hot_snapshot, python_decision, random_group

DETECTORS = [built_in(name) for name in BUILT_IN]
# Text around a number: anything but digits and the separators a card's groups may have.
AROUND = st.text(alphabet=string.ascii_letters + ".,;:!?()\n", max_size=12)


def _luhn_valid(body: str) -> str:
    """``body`` followed by the check digit that makes it pass Luhn."""
    return next(body + d for d in string.digits if luhn((body + d).encode()))


def luhn_card(run: bytes) -> bool:
    """A card run as content_detectors reads it, without its stretches: whole, or any group."""
    digits = re.sub(rb"[^0-9]", b"", run)
    groups = [digits, *re.findall(rb"[0-9]+", run)]
    return any(13 <= len(g) <= 19 and luhn(g) for g in groups)


def _grouped(digits: str, separator: str) -> str:
    return separator.join(digits[i : i + 4] for i in range(0, len(digits), 4))


@given(
    body=st.text(alphabet=string.digits, min_size=12, max_size=18),
    separator=st.sampled_from(["", " ", "-"]),
    before=AROUND,
    after=AROUND,
)
def test_any_luhn_valid_number_of_13_to_19_digits_is_a_card(
    body: str, separator: str, before: str, after: str
) -> None:
    number = _luhn_valid(body)
    assert card(f"{before} {_grouped(number, separator)} {after}".encode())
    wrong = number[:-1] + str((int(number[-1]) + 1) % 10)
    assert not card(f"{before} {_grouped(wrong, separator)} {after}".encode())


@given(
    body=st.text(alphabet=string.digits, min_size=12, max_size=18),
    separator=st.sampled_from(CARD_SEPARATORS),
    before=AROUND,
    after=AROUND,
)
def test_a_card_split_by_any_separator_is_found_and_by_two_is_not(
    body: str, separator: str, before: str, after: str
) -> None:
    number = _luhn_valid(body)
    assert card(f"{before} {_grouped(number, separator)} {after}".encode())
    # Two separators split it: its first 8 digits and the rest, each too short for a card.
    doubled = separator * 2 if separator != "\r\n" else "\r\n\n"
    assert not card(f"{before} {number[:8]}{doubled}{_grouped(number[8:], separator)} {after}".encode())


def test_every_unicode_space_is_a_card_separator() -> None:
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    assert set(spaces) <= set(CARD_SEPARATORS), set(spaces) - set(CARD_SEPARATORS)
    for space in spaces:
        assert card(_grouped("4111111111111111", space).encode()), repr(space)


@pytest.mark.parametrize(
    "address",
    ["jürgen.müller@example.org", "info@bücher.de", "用户@例子.广告", "почта@пример.рф", "a@b.co"],
)
def test_internationalised_e_mail_addresses_are_found(address: str) -> None:
    assert email(f"write to {address}, thanks".encode()), address


def _iban(country: str, bban: str) -> str:
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    return f"{country}{98 - int(numeric) % 97:02d}{bban}"


@given(
    country=st.text(alphabet=string.ascii_uppercase, min_size=2, max_size=2),
    bban=st.text(alphabet=string.ascii_uppercase + string.digits, min_size=11, max_size=30),
    grouped=st.booleans(),
    lower=st.booleans(),
    before=AROUND,
)
def test_any_iban_with_a_right_checksum_is_found_written_either_way(
    country: str, bban: str, grouped: bool, lower: bool, before: str
) -> None:
    text = _iban(country, bban)
    text = _grouped(text, " ") if grouped else text
    text = text.lower() if lower else text
    assert iban(f"{before} {text}.".encode())
    if not grouped:  # grouped, each run of groups of 15 or more characters is a candidate too
        # Check digits one off (99 wraps to 00: two off, mod 97): never the same remainder.
        broken = text[:2] + f"{(int(text[2:4]) + 1) % 100:02d}" + text[4:]
        assert not iban(f"{before} {broken}.".encode())


@settings(max_examples=300)
@given(
    st.integers(0, 2**32 - 1), st.text(alphabet="0123456789 .()+-@aZ\n\t\r\u00a0\u200b\u2013é", max_size=60)
)
def test_the_runner_finds_what_the_whole_regexes_find(seed: int, noise: str) -> None:
    """The runner runs each built-in only on the stretches a cheaper pass found; PCRE, on the fast
    path, runs the regexes over everything. Both find the same."""
    blob = f"{content_cases.text(random.Random(seed))} {noise}".encode()
    assert phone(blob) == (re.search(PHONE.encode(), blob) is not None), blob
    assert email(blob) == (re.search(EMAIL.encode(), blob) is not None), blob
    runs = [m.group() for m in re.finditer(CARD_RUN.encode(), blob)]
    whole = any(luhn_card(r) for r in runs)
    assert card(blob) == whole, blob


@given(st.text(alphabet=string.ascii_letters + " .,;\n", max_size=200))
def test_text_without_digits_or_at_signs_matches_no_built_in(text: str) -> None:
    assert first_found(DETECTORS, [text.encode()]) is None


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("card 4111 1111 1111 1111 exp 12/29", "card"),
        ("order 1234 4111111111111111", "card"),
        ("4111 1111  1111 1111", None),  # a double space splits it
        ("IBAN DE89 3704 0044 0532 0130 00, thanks", "iban"),
        ("mail jane.doe@example.org", "email"),
        ("user@localhost", None),
        ("call +44 20 7946 0958", "phone"),
        ("(555) 123-4567", "phone"),
        ("020 7946 0958", "phone"),
        ("version 1.2.3 from 2024-01-15, 12 items at 3.50", None),
    ],
)
def test_the_built_ins_on_examples(text: str, found: str | None) -> None:
    assert first_found(DETECTORS, [text.encode()]) == found


def test_detectors_are_tried_in_order_and_never_match_across_two_texts() -> None:
    both = ["a@b.org", "4111111111111111"]
    assert first_found(DETECTORS, [s.encode() for s in both]) == "card"
    assert first_found([built_in("email"), built_in("card")], [s.encode() for s in both]) == "email"
    assert first_found(DETECTORS, [b"4111 1111", b"1111 1111"]) is None
    assert first_found(DETECTORS, [b"jane@", b"example.org"]) is None


def test_check_config_says_what_is_read_and_what_a_match_does() -> None:
    config = parse({"rules": [{"name": "partners", "action": "overflow", "content_checks": True}]})
    assert (
        "content checks (on rules partners and routes with content_checks): card, iban, email, phone "
        "over the text inputs of bodies up to 65536 bytes; a match is decided as 'confidential' and "
        "stays on premises; bodies that cannot be read stay on premises"
    ) in explain(config)


def test_the_class_a_match_gives_may_not_leave() -> None:
    with pytest.raises(ConfigError, match="classify_as 'Public'"):
        parse({"content": {"classify_as": "Public"}, "residency": {"cloud_allowed": ["public"]}})
    with pytest.raises(ConfigError, match="built-in detector's name"):
        parse({"content": {"patterns": {"card": "x+"}}})


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_a_match_never_lets_a_request_leave_that_would_otherwise_stay(seed: int, focus: bool) -> None:
    """Random configs, snapshots, routes (reading every request's text or not), requests and bodies:
    with content checks a request leaves only where it would leave without them, and never once
    what was read kept it home."""
    rng = random.Random(seed)
    group = random_group(rng, 24, content_focus=focus)
    assert group.content is not None
    for case in group.cases:
        try:
            checked, verdict = python_decision(
                case, case["route"], group.policy, group.snapshot, group.content
            )
        except PathError:
            continue  # a path no layer may read two ways
        unchecked, _ = python_decision(case, case["route"], group.policy, group.snapshot, None)
        assert not checked.is_cloud or unchecked.is_cloud, case
        if verdict is not None and group.content.keeps_home(verdict):
            assert not checked.is_cloud, case


@given(st.integers(0, 2**32 - 1), st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4))
def test_a_tightened_request_is_never_given_a_cloud_target(seed: int, headers: dict[str, str]) -> None:
    rng = random.Random(seed)
    group = random_group(rng, 0)
    assert group.content is not None
    features = RequestFeatures("/v2/models/add_sub/infer", headers, model="add_sub")
    snapshot = hot_snapshot(rng, group.policy)
    assert not decide(tightened(features, group.policy, group.content), snapshot, group.policy).is_cloud


def test_the_decision_table_carries_the_detectors_and_the_rules_that_ask() -> None:
    config = SpillwayConfig.model_validate(
        {
            "rules": [{"name": "read", "action": "overflow", "content_checks": True}],
            "content": {
                "detectors": ["iban"],
                "patterns": {"emp": "EMP-[0-9]{6}"},
                "unscannable": "as_labelled",
            },
        }
    )
    policy = build_policy(config)
    snapshot = hot_snapshot(random.Random(0), policy)
    table = decision_table.build_table(policy, snapshot, {}, 1, 0.0, content=content_policy(config))
    emp = program("EMP-[0-9]{6}").encoded()
    assert table["format"] == decision_table.FORMAT
    assert table["content"] == {
        "detectors": [
            {"name": "iban", "kind": "iban"},
            {"name": "emp", "kind": "pattern", "pattern": "EMP-[0-9]{6}", "program": emp},
        ],
        "max_bytes": 65536,
        "unscannable_stays": False,
        "classify_as": "confidential",
        "rules": ["read"],
        "budget_ms": 50,
    }


def _route_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert main(["apisix-route", "--config", "examples/spillway.yaml", "--content-checks", *extra]) == 0
    made: dict[str, Any] = json.loads(capsys.readouterr().out)
    return made


def test_apisix_route_asks_for_content_checks_on_either_route(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", "a-route-token-for-the-content-tests-0123456789")
    ext = _route_json(capsys)["plugins"]["ext-plugin-pre-req"]["conf"]
    assert ext == [{"name": "spillway", "value": '{"content_checks": true}'}]
    assert _route_json(capsys, "--fast-path")["plugins"]["spillway"]["content_checks"] is True


def test_the_fast_path_splits_cards_by_the_same_separators() -> None:
    lua = (ROOT / "gateway_plugin/fast_path/lua/apisix/plugins/spillway/detect.lua").read_text()
    declared = lua[lua.index("local CARD_RUN = ") : lua.index("local IBAN_RUN = ")]
    assert "".join(re.findall(r"\[=\[(.*?)\]=\]", declared)) == CARD_RUN
    # The run is one separator, of either kind, between two digits.
    assert re.fullmatch(rf"[0-9](?:{CARD_SEPARATOR}?[0-9]){{12,}}".encode(), b"4111\r\n1111\xc2\xa01111-1111")
