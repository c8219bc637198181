"""One policy, two executions: Python's ``decide()`` and the ``spillway`` Lua plugin's, on the real
APISIX, agree on every random case (config, route overrides, snapshot, request), and no case a
residency rule keeps home is given a cloud target by the Lua side.

The cases go through a test-only plugin (``tests/lua/apisix/plugins/spillway-cases.lua``) that runs
the plugin's own modules on each: the table as the runner encodes it, parsed and compiled by the
plugin; the route's overrides; the request's features; its body's text read where the route or a
rule asks for content checks; the decision. Thousands of cases per request keep CI time sane. Not
covered: invoke mode (the fast path serves upstream-mode targets only) and the plugin's reservation
of cap, budget and probe (counted in the shared dict, exercised on the route by
``test_apisix_fast_path``).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import apisix
from gateway_plugin.books.ledger import HOUR, Ledger
from gateway_plugin.content.checks import HEADER_JSON_LENGTH, Unscannable
from gateway_plugin.fast_path import table as decision_table
from gateway_plugin.fast_path.route import lua_path
from gateway_plugin.policy.decide import may_leave
from gateway_plugin.policy.model import LOCAL, SHED, Reason
from gateway_plugin.policy.snapshot import RequestFeatures
from gateway_plugin.request.spillway import RouteOverrides, _route_policy
from testing.apisix import lua_plugin_gateway, needs_apisix
from testing.http import http
from testing.paths import ROOT
from tests.fast_path_cases import Group, bodies_group, expected, python_decision, random_group

pytestmark = [pytest.mark.integration, needs_apisix()]

SEED = 20261201
GROUPS, PER_GROUP, PER_BATCH = 400, 48, 50  # 19,200 cases in eight requests
CONTENT_GROUPS = 200  # 9,600 more on a hot cluster, every route reading its requests' text


@pytest.fixture(scope="module")
def gateway() -> Iterator[apisix.Apisix]:
    with lua_plugin_gateway("spillway-cases", "cases") as running:
        yield running


def _lua(gateway: apisix.Apisix, groups: list[Group]) -> list[dict[str, object]]:
    body = json.dumps([{"table": g.table, "cases": g.cases} for g in groups]).encode()
    status, _, answer = http(
        "POST", gateway.url + "/spillway-cases", body, {"content-type": "application/json"}
    )
    assert status == 200, answer[:500]
    decoded: list[dict[str, object]] = json.loads(answer)
    return decoded


def _leaves_allowed(group: Group, case: dict[str, object]) -> bool:
    route = RouteOverrides.model_validate(case["route"])
    headers = {k: ", ".join(v) if isinstance(v, list) else v for k, v in case["headers"].items()}  # type: ignore[union-attr]
    return may_leave(RequestFeatures("/", headers), _route_policy(group.policy, route))


def test_python_and_lua_decide_every_case_alike_and_keep_residency(gateway: apisix.Apisix) -> None:
    rng = random.Random(SEED)
    groups = [random_group(rng, PER_GROUP) for _ in range(GROUPS)]
    groups += [random_group(rng, PER_GROUP, content_focus=True) for _ in range(CONTENT_GROUPS)]
    checked, cloud, kept, refused = 0, 0, 0, 0
    labels: set[str] = set()
    found: dict[str, int] = {}
    mismatches: list[str] = []
    for start in range(0, len(groups), PER_BATCH):
        batch = groups[start : start + PER_BATCH]
        for group, answer in zip(batch, _lua(gateway, batch), strict=True):
            assert "error" not in answer, f"the plugin refused a table the runner made: {answer}"
            for case, got in zip(group.cases, answer["results"], strict=True):  # type: ignore[call-overload]
                want = expected(group, case)
                checked += 1
                if "cost_usd" in got:
                    got["cost_usd"] = float(got["cost_usd"])
                if got != want:
                    mismatches.append(f"{json.dumps(case)}\n  python {want}\n  lua    {got}")
                if "refused" in got:
                    refused += 1
                    continue
                if got["read"]:
                    found[str(got["content"])] = found.get(str(got["content"]), 0) + 1
                if got["target"] not in (LOCAL, SHED):
                    cloud += 1
                    assert _leaves_allowed(group, case), f"Lua sent an on-prem-only request out: {case}"
                    assert not (got["read"] and _kept_by_content(group, got)), (
                        f"text matched, sent out: {case}"
                    )
                kept += bool(got["residency_kept"])
                labels.add(str(got["label"]).partition(":")[0])
    assert not mismatches, f"{len(mismatches)} of {checked} differ; first:\n" + "\n".join(mismatches[:5])
    assert checked >= 10_000
    # The cases reach every branch that matters: some go out, some are kept home by residency.
    assert cloud > 500 and kept > 500 and refused > 500, (cloud, kept, refused)
    every = {r.value for r in Reason} - {Reason.INVOKE_FAILED.value}
    assert every | {"rule", "residency+local_saturated", "no_target+local_saturated"} <= labels, labels
    # Read bodies reach every verdict: each built-in, some operator pattern and some random one
    # found, each reason a text could not be read but the budget (the clock's: see below), and
    # nothing found.
    reasons = (r for r in Unscannable if r is not Unscannable.OVER_BUDGET)
    every_verdict = {"card", "iban", "email", "phone", "None", *(f"unscannable:{r}" for r in reasons)}
    assert every_verdict <= set(found), found
    assert any(k.startswith("p") for k in found) and any(k.startswith("r") for k in found), found
    assert any(k.startswith("refused:duplicate key") for k in found), found
    own, headroom = _moved_by_the_load_estimate(groups)
    assert own > 300 and headroom > 100, (own, headroom)
    out, shed = _moved_by_a_failing_cluster(groups)
    assert out > 20 and shed > 1000, (out, shed)


def _framed(body: bytes, **headers: str) -> tuple[bytes, dict[str, str]]:
    return body, {"content-length": str(len(body)), **headers}


def _tensor(*texts: str, datatype: str = "BYTES") -> bytes:
    return json.dumps(
        {"inputs": [{"name": "t", "datatype": datatype, "shape": [1], "data": list(texts)}]}
    ).encode()


def _refused(key: str) -> str:
    """The verdict on a body with ``key`` (as the refusal shows it) twice in one object."""
    return (
        f'refused:duplicate key "{key}" in the JSON body: Triton reads the first of them, so each key '
        "may appear once in an object"
    )


def _headed(header: bytes, tensors: bytes) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor body: the JSON ``header``, then ``tensors``."""
    return _framed(header + tensors, **{HEADER_JSON_LENGTH: str(len(header))})


def _binary(size: bytes, tensors: bytes) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor body whose one input declares ``size`` bytes."""
    return _headed(
        b'{"inputs": [{"datatype": "FP32", "parameters": {"binary_data_size": ' + size + b"}}]}", tensors
    )


DEEP = b'{"inputs": [], "deep": ' + b"[" * 31 + b"1" + b"]" * 31 + b"}"  # 32 levels: the most read
# Bodies where two JSON decoders could part, each with the verdict both must reach.
BODIES: dict[str, tuple[tuple[bytes, dict[str, str]], str | None]] = {
    "a card": (_framed(_tensor("pay 4111 1111 1111 1111")), "card"),
    "a card as an escape": (
        _framed(b'{"inputs":[{"datatype":"BYTES","data":["\\u0034111111111111111"]}]}'),
        "card",
    ),
    "numbers only": (_framed(_tensor("4111111111111111", datatype="FP32")), None),
    "a number JSON allows not (1.)": (_framed(b'{"n": 1., "inputs": []}'), "unscannable:not_json"),
    "a number JSON allows not (-.5)": (_framed(b'{"n": -.5, "inputs": []}'), "unscannable:not_json"),
    "a number JSON allows not (1.e5)": (_framed(b'{"n": [1.e5], "inputs": []}'), "unscannable:not_json"),
    "a dot inside a string": (_framed(b'{"p": "1. -.5", "inputs": []}'), None),
    "NaN": (_framed(b'{"n": NaN}'), "unscannable:not_json"),
    "a hex number": (_framed(b'{"n": 0x10}'), "unscannable:not_json"),
    "a leading zero": (_framed(b'{"n": 01}'), "unscannable:not_json"),
    "an integer of 5000 digits": (_framed(b'{"n": ' + b"9" * 5000 + b', "inputs": []}'), None),
    "1e999": (_framed(b'{"n": 1e999}'), None),
    "invalid UTF-8": (_framed(b'{"p": "\xff"}'), "unscannable:not_json"),
    "an encoded surrogate": (_framed(b'{"p": "\xed\xa0\x80"}'), "unscannable:not_json"),
    "a lone surrogate escape": (_framed(b'{"p": "\\ud800"}'), "unscannable:not_json"),
    "a surrogate pair": (_framed(b'{"p": "\\ud83d\\ude00"}'), None),
    "a raw NUL after the object": (_framed(b"{}\x00garbage"), "unscannable:not_json"),
    "a raw NUL in a string": (_framed(b'{"p": "a\x00b"}'), "unscannable:not_json"),
    "an escaped NUL": (_framed(b'{"parameters": {"p": "a\\u0000b a@b.org"}}'), "email"),
    "control characters in a string": (_framed(b'{"parameters": {"p": "\x01 a@b.org \x1f"}}'), "email"),
    "a BOM": (_framed(b"\xef\xbb\xbf{}"), "unscannable:not_json"),
    "an array at the top": (_framed(b'[{"parameters": {"p": "a@b.org"}}]'), "unscannable:not_json"),
    "trailing garbage": (_framed(b"{} x"), "unscannable:not_json"),
    "JSON whitespace around": (_framed(b' \t\r\n{"parameters": {"p": "a@b.org"}}\n'), "email"),
    "32 levels": (_framed(DEEP), None),
    "33 levels": (_framed(DEEP.replace(b"[1]", b"[[1]]")), "unscannable:not_json"),
    "a duplicate key, the last clean": (
        _framed(b'{"inputs": [{"datatype": "BYTES", "data": ["4111111111111111"]}], "inputs": []}'),
        _refused("inputs"),
    ),
    "a duplicate key spelt as an escape": (
        _framed(b'{"inputs": [], "\\u0069nputs": []}'),
        _refused("inputs"),
    ),
    "a duplicate key inside a tensor": (
        _framed(b'{"inputs": [{"datatype": "BYTES", "datatype": "FP32", "data": ["4111111111111111"]}]}'),
        _refused("datatype"),
    ),
    "duplicate keys: the smallest is named": (
        _framed(b'{"b": {"z": 1, "z": 2}, "a": 1, "a": [], "c": 0, "c": 1}'),
        _refused("a"),
    ),
    "a duplicate key beyond ASCII": (_framed('{"é": 1, "\\u00e9": 2}'.encode()), _refused("\\xc3\\xa9")),
    "a long duplicate key": (
        _framed(b'{"' + b"k" * 70 + b'": 1, "' + b"k" * 70 + b'": 2}'),
        _refused("k" * 64 + "..."),
    ),
    "a duplicate key holding quotes": (_framed(b'{"a\\"b": 1, "a\\u0022b": 2}'), _refused("a\\x22b")),
    "the same key in two objects": (_framed(b'{"a": {"k": 1}, "b": {"k": [{"k": 2}]}, "k": 3}'), None),
    "a key's text inside a value": (
        _framed(b'{"parameters": {"p": "\\"p\\": 1, {\\"p\\": 2}", "q": "p"}, "inputs": []}'),
        None,
    ),
    "a duplicate key and NaN": (_framed(b'{"a": 1, "a": NaN}'), "unscannable:not_json"),
    "a duplicate key in a binary body's header": (
        _headed(b'{"inputs": [], "inputs": []}', b"1234"),
        _refused("inputs"),
    ),
    "bytes past a header declaring no tensor": (
        _headed(b'{"inputs": []}', b"4111111111111111"),
        "unscannable:trailing_bytes",
    ),
    "a binary tensor as declared": (_binary(b"4", b"\x00\x00\x80?"), None),
    "a binary tensor's size written 4.0": (_binary(b"4.0", b"\x00\x00\x80?"), None),
    "a byte past the binary tensor": (_binary(b"4", b"\x00\x00\x80?x"), "unscannable:trailing_bytes"),
    "a byte short of the binary tensor": (_binary(b"4", b"\x00\x00\x80"), "unscannable:trailing_bytes"),
    "a binary size that is text": (_binary(b'"4"', b"\x00\x00\x80?"), "unscannable:trailing_bytes"),
    "a binary size that is negative": (_binary(b"-4", b""), "unscannable:trailing_bytes"),
    "a binary size that is true": (_binary(b"true", b"x"), "unscannable:trailing_bytes"),
    "a binary size that is null": (_binary(b"null", b""), "unscannable:trailing_bytes"),
    "a binary size past every body": (_binary(b"1e300", b""), "unscannable:trailing_bytes"),
    "a binary size of 2**53 + 2": (_binary(b"9007199254740994", b""), "unscannable:trailing_bytes"),
    "a binary size of 4.5": (_binary(b"4.5", b"\x00\x00\x80?"), "unscannable:trailing_bytes"),
    "two binary tensors": (
        _headed(
            b'{"inputs": [{"parameters": {"binary_data_size": 2}}, {"data": [1]}, '
            b'{"parameters": {"binary_data_size": 3}}]}',
            b"abcde",
        ),
        None,
    ),
    "an output's binary_data_size is no input's": (
        _headed(b'{"inputs": [], "outputs": [{"parameters": {"binary_data_size": 3}}]}', b"abc"),
        "unscannable:trailing_bytes",
    ),
    "a card in a header with bytes past it": (
        _framed(_tensor("4111111111111111") + b"xx", **{HEADER_JSON_LENGTH: str(len(_tensor("x" * 16)))}),
        "card",
    ),
    "a card split by tabs": (_framed(_tensor("4111\t1111\t1111\t1111")), "card"),
    "a card split by newlines": (_framed(_tensor("4111\n1111\n1111\n1111")), "card"),
    "a card split by CR LF": (_framed(_tensor("4111\r\n1111\r\n1111\r\n1111")), "card"),
    "a card split by no-break spaces": (_framed(_tensor("4111\u00a01111\u00a01111\u00a01111")), "card"),
    "a card split by zero-width spaces": (_framed(_tensor("4111\u200b1111\u200b1111\u200b1111")), "card"),
    "a card split by en dashes": (_framed(_tensor("4111\u20131111\u20131111\u20131111")), "card"),
    "a card split by ideographic spaces": (_framed(_tensor("4111\u30001111\u30001111\u30001111")), "card"),
    "a card split by two tabs": (_framed(_tensor("4111\t\t1111\t\t1111\t\t1111")), None),
    "a card across two texts": (_framed(_tensor("4111 1111", "1111 1111")), None),
    "a card in a list-valued parameter": (
        _framed(b'{"parameters": {"p": [1, ["4111111111111111"]]}}'),
        "card",
    ),
    "a card in an object-valued parameter": (
        _framed(b'{"inputs": [{"parameters": {"p": {"q": "4111111111111111"}}}]}'),
        "card",
    ),
    "a card as a parameter's name": (
        _framed(b'{"outputs": [{"parameters": {"4111111111111111": 1}}]}'),
        "card",
    ),
    "a card in an object in BYTES data": (
        _framed(b'{"inputs": [{"datatype": "BYTES", "data": [[{"4111111111111111": "x"}]]}]}'),
        "card",
    ),
    "an IDN e-mail address": (_framed(_tensor("write to jürgen@bücher.de")), "email"),
    "an IDN e-mail address, escaped": (
        _framed(b'{"parameters": {"p": "\\u7528@\\u4f8b\\u5b50.\\u5e7f\\u544a"}}'),
        "email",
    ),
    "text in a binary BYTES tensor": (
        _framed(b'{"inputs": [{"datatype": "BYTES", "parameters": {"binary_data_size": 20}}]}'),
        "unscannable:binary_text",
    ),
    "a numeric binary tensor is not read": (_binary(b"16", b"4111111111111111"), None),
    "the JSON header is": (
        _framed(
            _tensor("a@b.org") + b"\x00\xff",
            **{"inference-header-content-length": str(len(_tensor("a@b.org")))},
        ),
        "email",
    ),
    "a JSON header longer than the body": (
        _framed(b"{}", **{HEADER_JSON_LENGTH: "3"}),
        "unscannable:not_json",
    ),
    "no size (chunked)": ((_tensor("x"), {"transfer-encoding": "chunked"}), "unscannable:unknown_size"),
    "over the bound": (_framed(_tensor("x" * 70000)), "unscannable:too_large"),
    "no body": ((b"", {}), None),
}


def test_python_and_lua_read_the_same_bodies_alike(gateway: apisix.Apisix) -> None:
    """Where the runner's and the plugin's JSON decoders differ (numbers strtod reads and JSON does
    not, NUL bytes, surrogates, depth, UTF-8), both reach the same verdict, and it is the one named."""
    config = {
        "local": {"latency_target_ms": 200},
        "targets": [{"name": "aws", "kind": "http", "url": "http://127.0.0.1:1", "cold_start_ms": 0}],
    }
    group = bodies_group(config, [framed for framed, _ in BODIES.values()])
    (answer,) = _lua(gateway, [group])
    for (what, (_, verdict)), case, got in zip(BODIES.items(), group.cases, answer["results"], strict=True):  # type: ignore[call-overload]
        want = expected(group, case)
        got["cost_usd"] = float(got["cost_usd"])
        assert got == want, f"{what}: python {want}, lua {got}"
        assert got["read"] and got["content"] == verdict, f"{what}: {got}"
        assert got["target"] == ("local" if verdict is not None else "aws"), f"{what}: {got}"


def _random_ab(seed: int, size: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("ab") for _ in range(size))


def test_python_and_lua_stop_a_scan_over_its_budget_alike(gateway: apisix.Apisix) -> None:
    """A 1 ms budget and 64 KiB that keep an automaton building states (``a[ab]{20}(?:c|d)`` over
    random a and b, where the plugin's prefilter, ``a[ab]{20}``, is everywhere: RE2 takes tens of
    ms): both stop, keep the request home and say why. A short text without the prefilter is read
    whole: no clock is looked at before 8 KiB are read or (the plugin's automaton) 8 states built."""
    config = {
        "local": {"latency_target_ms": 200},
        "targets": [{"name": "aws", "kind": "http", "url": "http://127.0.0.1:1", "cold_start_ms": 0}],
        "content": {
            "detectors": [],
            "patterns": {"window": "a[ab]{20}(?:c|d)"},
            "max_scan_bytes": 131072,
            "scan_budget_ms": 1,
            "unscannable": "as_labelled",
        },
    }
    bodies = {
        "over budget": (_tensor(_random_ab(1, 65536)), "unscannable:over_budget"),
        "short": (_tensor("a" + "b" * 19 + "c, not a window"), None),
    }
    group = bodies_group(config, [_framed(body) for body, _ in bodies.values()])
    (answer,) = _lua(gateway, [group])
    for (what, (_, verdict)), case, got in zip(bodies.items(), group.cases, answer["results"], strict=True):  # type: ignore[call-overload]
        want = expected(group, case)
        got["cost_usd"] = float(got["cost_usd"])
        assert got == want, f"{what}: python {want}, lua {got}"
        assert got["content"] == verdict and got["target"] == ("local" if verdict else "aws"), (what, got)


def test_the_plugins_automaton_drops_its_states_and_finds_what_re2_finds(gateway: apisix.Apisix) -> None:
    """``a[ab]{12}(?:c|d)`` has 8,192 states over random a and b, far more than the plugin keeps
    per pattern (dfa.lua's MAX_STATES): it drops them and builds again, many times over 48 KiB
    (its prefilter, ``a[ab]{12}``, is everywhere), and finds a match at the very end as RE2 does;
    without it, nothing."""
    config = {
        "local": {"latency_target_ms": 200},
        "targets": [{"name": "aws", "kind": "http", "url": "http://127.0.0.1:1", "cold_start_ms": 0}],
        "content": {
            "detectors": [],
            "patterns": {"window": "a[ab]{12}(?:c|d)"},
            "max_scan_bytes": 131072,
            "scan_budget_ms": 10_000,
        },
    }
    text = _random_ab(4, 49152)
    bodies = {"at the end": (_tensor(text + "a" + "b" * 12 + "c"), "window"), "none": (_tensor(text), None)}
    group = bodies_group(config, [_framed(body) for body, _ in bodies.values()])
    (answer,) = _lua(gateway, [group])
    for (what, (_, verdict)), case, got in zip(bodies.items(), group.cases, answer["results"], strict=True):  # type: ignore[call-overload]
        want = expected(group, case)
        got["cost_usd"] = float(got["cost_usd"])
        assert got == want, f"{what}: python {want}, lua {got}"
        assert got["content"] == verdict, (what, got)


def test_a_built_in_regex_pcre_gives_up_on_keeps_the_request_home(gateway: apisix.Apisix) -> None:
    """PCRE's match limit (APISIX sets lua_regex_match_limit) on a built-in's regex: the plugin
    counts the scan as over budget and the request stays home, even with ``as_labelled``. (No
    built-in's regex backtracks so: the table is edited to carry one that does.)"""
    config = {
        "local": {"latency_target_ms": 200},
        "targets": [{"name": "aws", "kind": "http", "url": "http://127.0.0.1:1", "cold_start_ms": 0}],
        "content": {"detectors": ["email"], "unscannable": "as_labelled"},
    }
    group = bodies_group(config, [_framed(_tensor("a" * 5000 + "!"))])
    table = json.loads(group.table)
    (email,) = table["content"]["detectors"]
    email["pattern"] = "(a+)+$"
    (answer,) = _lua(gateway, [dataclasses.replace(group, table=json.dumps(table))])
    (got,) = answer["results"]  # type: ignore[call-overload]
    assert (got["content"], got["target"]) == ("unscannable:over_budget", "local"), got


def _kept_by_content(group: Group, got: dict[str, object]) -> bool:
    verdict = str(got["content"])
    assert group.content is not None
    return got["content"] is not None and (
        not verdict.startswith("unscannable:")
        or group.content.unscannable_stays
        or verdict == f"unscannable:{Unscannable.OVER_BUDGET}"
    )


def _moved_by_a_failing_cluster(groups: list[Group]) -> tuple[int, int]:
    """How many cases a failing cluster sends out, and sheds at once, that a healthy one would
    decide otherwise: the cases reach both branches, so the Lua side is checked on them."""
    out = shed = 0
    for group in groups:
        healthy = group.snapshot._replace(
            local={k: v._replace(failing=False) for k, v in group.snapshot.local.items()}
        )
        for case in group.cases:
            if "refused" in expected(group, case):
                continue
            d, _ = python_decision(case, case["route"], group.policy, group.snapshot)
            if d != python_decision(case, case["route"], group.policy, healthy)[0]:
                out += d.is_cloud
                shed += d.reason is Reason.LOCAL_FAILING
    return out, shed


def _moved_by_the_load_estimate(groups: list[Group]) -> tuple[int, int]:
    """How many cases decide otherwise without the gateway's own in-flight count, and without the
    on-prem-only headroom: the cases reach both, so the Lua side is checked on them."""
    own = headroom = 0
    for group in groups:
        uncounted = group.snapshot._replace(
            local={k: v._replace(in_flight=-1) for k, v in group.snapshot.local.items()}
        )
        no_headroom = dataclasses.replace(group.policy, onprem_headroom=0.0)
        for case in group.cases:
            if "refused" in expected(group, case):
                continue
            d, _ = python_decision(case, case["route"], group.policy, group.snapshot)
            for other, moved in ((uncounted, "own"), (None, "headroom")):
                if other is None:
                    e, _ = python_decision(case, case["route"], no_headroom, group.snapshot)
                else:
                    e, _ = python_decision(case, case["route"], group.policy, other)
                if (e.target, e.label, e.overflowing) != (d.target, d.label, d.overflowing):
                    own, headroom = (own + 1, headroom) if moved == "own" else (own, headroom + 1)
    return own, headroom


def test_the_plugin_lives_where_apisix_lua_path_says() -> None:
    assert (lua_path() / "apisix" / "plugins" / "spillway.lua").is_file()
    assert Path(lua_path()).is_relative_to(ROOT / "gateway_plugin")


def _broken(table: str, old: str, new: str) -> str:
    assert old in table, old
    return table.replace(old, new, 1)


def test_the_plugin_refuses_a_malformed_table_and_says_why(gateway: apisix.Apisix) -> None:
    """What the fetching worker checks before storing a table; a refused one leaves the last good
    table in place (ageing towards stale, tested on the route in test_apisix_fast_path)."""
    group = random_group(random.Random(SEED), 1)
    good = group.table
    first_target = next(iter(group.policy.targets))
    bad = {
        "not JSON": "{",
        "another format": _broken(good, f'"format":{decision_table.FORMAT}', '"format":1'),
        "no policy": _broken(good, '"policy":', '"policie":'),
        "a pattern PCRE cannot compile": _broken(
            good,
            '"rules":[',
            '"rules":[{"name":"x","action":"local","targets":[],"headers":[],"args":[],"models":[],"uri":"(unclosed"},',
        ),
        "an unknown action": _broken(
            good,
            '"rules":[',
            '"rules":[{"name":"x","action":"cloud","targets":[],"headers":[],"args":[],"models":[]},',
        ),
        "a NaN latency": _broken(good, '"latency_ms":', '"latency_ms":NaN,"was":'),
        "a cap that is text": _broken(
            good, f'"{first_target}":{{"cap":', f'"{first_target}":{{"cap":"many","was":'
        ),
        "a cloud target without its value": _broken(good, '"value":', '"valeu":'),
        "a target without the headers it may receive": _broken(good, '"forward":', '"forwarded":'),
    }
    answers = _lua(gateway, [Group(group.policy, group.snapshot, text, group.cases) for text in bad.values()])
    for what, answer in zip(bad, answers, strict=True):
        assert "error" in answer and "results" not in answer, f"{what}: {answer}"
    assert "results" in _lua(gateway, [group])[0]


def _stream_body(rng: random.Random) -> bytes:
    """Events as a stream may frame them: LF or CRLF line ends, blank lines doubled, data lines
    split across chunks anywhere."""
    pieces = [b"data: {}", b"data: x", b"\n", b"\r\n", b"\n\n", b"\r\n\r\n", b"\n\r\n", b"\r", b":k\n"]
    return b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 40)))


def _chunked(rng: random.Random, body: bytes) -> list[bytes]:
    cuts = (
        sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randrange(0, 12))))
        if len(body) > 1
        else []
    )
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def test_a_streams_events_are_counted_alike_chunk_by_chunk_and_whole(gateway: apisix.Apisix) -> None:
    """The plugin counts a stream's events (its tokens, which its bill settles at) as chunks go by;
    however the body is cut, the count is that of the whole body read at once (a blank line is
    ``\\n\\r?\\n``, each line end taken once)."""
    rng = random.Random(SEED)
    bodies = [_stream_body(rng) for _ in range(2_000)]
    groups = [{"chunks": [base64.b64encode(c).decode() for c in _chunked(rng, b)]} for b in bodies]
    status, _, answer = http(
        "POST",
        gateway.url + "/spillway-cases",
        json.dumps(groups).encode(),
        {"content-type": "application/json"},
    )
    assert status == 200, answer[:500]
    counts = [got["count"] for got in json.loads(answer)]
    want = [len(re.findall(rb"\n\r?\n", body)) for body in bodies]
    differ = [(b, c, w) for b, c, w in zip(bodies, counts, want, strict=True) if c != w]
    assert not differ, f"{len(differ)} of {len(bodies)} differ; first: {differ[:3]}"
    assert sum(want) > 5_000


def test_a_stream_settled_after_its_hour_rolled_gives_back_to_no_later_hour(gateway: apisix.Apisix) -> None:
    """The plugin settles a stream against the price its decision held; what the stream cost less
    is given back only to the budget's hour it was held in, as the runner's ledger does when it
    takes the settlement in (up to the report's delay later): an hour gone must not hand it to the
    hour then, which would spend more than its budget. Compared on random holds and bills around
    hour boundaries, some settled within the delay of one, with what the ledger's hour holds."""
    rng = random.Random(SEED)
    rows = []
    for i in range(2_000):
        held_at = rng.choice([3599.0, 7199.5, 86399.9, 1_765_000_000.0]) + rng.uniform(-30, 30)
        now, delay = held_at + rng.uniform(0, 60), rng.choice([0.0, rng.uniform(0, 2)])
        if i % 4 == 0:  # settled in the hour it was held, at most the delay before the hour ends
            delay = rng.uniform(0.05, 2)
            now = max(held_at, (held_at // HOUR + 1) * HOUR - rng.uniform(0, delay))
        rows.append([rng.uniform(0, 1), rng.uniform(0, 1), held_at, now, delay])
    status, _, answer = http(
        "POST",
        gateway.url + "/spillway-cases",
        json.dumps([{"settle": rows}]).encode(),
        {"content-type": "application/json"},
    )
    assert status == 200, answer[:500]
    differ, rolled_back, rolled_in_delay = [], 0, 0
    for (held, bill, held_at, now, delay), got in zip(rows, json.loads(answer)[0]["settled"], strict=True):
        spent, given_back = float(got[0]), float(got[1])
        taken_in = now + delay
        ledger = Ledger()
        ledger.spend("t", held, held_at)
        ledger.spend("t", bill - held, taken_in, held_at)
        same_hour = held_at // HOUR == taken_in // HOUR
        hour_then = (held if same_hour else 0.0) + spent - given_back
        rolled_back += bill < held and not same_hour
        rolled_in_delay += bill < held and not same_hour and held_at // HOUR == now // HOUR
        if abs(hour_then - ledger.spent("t", taken_in)[0]) > 1e-9:
            differ.append((held, bill, held_at, now, delay, spent, given_back))
    assert not differ, f"{len(differ)} of {len(rows)} differ; first: {differ[:3]}"
    assert rolled_back > 100, "the cases cross hours with streams that cost less than held"
    assert rolled_in_delay > 50, "the cases settle within the delay of an hour's end"
