"""Content checks on a real Apache APISIX 3.18, on both routes: the ext-plugin route (the runner reads
the body over ExtraInfo) and the fast path (the ``spillway`` Lua plugin reads it in the access
phase). While the cluster is overloaded, a request labelled ``public`` whose text carries a card
number stays home on both, one without detectable content leaves, and the residency log names the
detector, never the text."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testing.apisix import Stack, StackStarter, content_routes, needs_apisix
from testing.http import http, wait_until
from testing.standins import StandIns
from tests.content_cases import CARD_SEPARATORS

pytestmark = [pytest.mark.integration, needs_apisix()]

CARD = "4111 1111 1111 1111"
# The fast path's route is this one path; every other /v2/ path is the ext-plugin route's.
FAST = "/v2/models/add_sub/infer"
EXT = "/v2/models/add_sub/versions/1/infer"
PATHS = {"ext-plugin": EXT, "fast path": FAST}


@pytest.fixture(scope="module")
def stack(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Stack:
    config = {**module_stand_ins.config(), "content": {"max_scan_bytes": 4096}}
    config["tenants"]["quotas"]["single"] = {"concurrency": 1}
    return module_apisix_stack(
        config, content_routes(config, FAST), fast_path=True, attr={"stale_after_s": 0.5}
    )


def _inference(*texts: str) -> bytes:
    tensor = {"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}
    return json.dumps({"inputs": [tensor], "parameters": {"note": "from the test"}}).encode()


def _send(stack: Stack, path: str, body: bytes, classification: str = "public") -> tuple[str, str]:
    """Which upstream answered, and the decision."""
    headers = {"content-type": "application/json", "x-data-classification": classification}
    status, answer_headers, answer = http("POST", stack.gateway.url + path, body, headers)
    assert status == 200, (status, answer[:300])
    return json.loads(answer)["upstream"], answer_headers.get("x-spillway-decision", "")


def test_a_public_request_carrying_a_card_number_stays_home_on_both_routes(stack: Stack) -> None:
    stack.set_load(500)
    for name, path in PATHS.items():
        leaving = _send(stack, path, _inference("what is the capital of France?"))
        assert leaving[0] == "aws" and leaving[1].startswith("aws;overflow"), (name, leaving)
        carried = _send(stack, path, _inference("my card is", f"{CARD}, exp 12/29"))
        assert carried == ("local", "local;residency"), (name, carried)
        # More than max_scan_bytes is not read, and stays home by default.
        large = _send(stack, path, _inference("x" * 5000))
        assert large == ("local", "local;residency"), (name, large)
    assert not any(CARD.replace(" ", "") in json.dumps(seen).replace(" ", "") for seen in stack.aws.seen)


def _counted(stack: Stack, family: str, label: str) -> float:
    found = re.search(rf"{family}\{{{label}\}} ([0-9.e+]+)", stack.metrics())
    return float(found.group(1)) if found else 0.0


def test_matches_are_counted_by_detector_and_logged_without_the_text(stack: Stack) -> None:
    stack.set_load(500)
    counts = {
        "spillway_content_matches_total": 'detector="email"',
        "spillway_content_unscannable_total": 'reason="not_json"',
    }
    before = {family: _counted(stack, family, label) for family, label in counts.items()}
    for path in PATHS.values():
        assert _send(stack, path, _inference("write to jane.doe@example.org"))[0] == "local"
        assert _send(stack, path, b"jane.doe@example.org, not JSON")[0] == "local"
    # The fast path's counts reach the runner with the plugin's next table fetch.
    wait_until(
        lambda: all(_counted(stack, f, label) == before[f] + 2 for f, label in counts.items()),
        10,
        "both routes' matches counted",
    )
    wait_until(lambda: stack.gateway.error_log().count('"content": "email"') == 2, 10, "residency log lines")
    lines = [line for line in stack.gateway.error_log().splitlines() if '"content": "email"' in line]
    # One from each route: the runner's own decision, and the fast path's summary.
    assert sorted('"via": "fast_path"' in line for line in lines) == [False, True], lines
    # Each names the class the client sent, not the one the request was then decided as.
    assert all('"classification": "public"' in line for line in lines), lines
    assert "jane.doe" not in stack.gateway.error_log()


def _answer(stack: Stack, path: str, body: bytes, **headers: str) -> tuple[int, str, dict[str, Any]]:
    """The status, which upstream answered ("" for none: the gateway did) and the decoded answer."""
    sent = {"content-type": "application/json", "x-data-classification": "public", **headers}
    status, _, answer = http("POST", stack.gateway.url + path, body, sent)
    decoded = json.loads(answer) if answer.startswith(b"{") else {}
    return status, str(decoded.get("upstream", "")), decoded


def _tensor(name: str, text: str, datatype: str = "BYTES") -> str:
    return json.dumps({"name": name, "datatype": datatype, "shape": [1], "data": [text]})


# The card in the first of two spellings of a key: Triton reads the first (RapidJSON's FindMember),
# Python's json and cjson the last.
DUPLICATES = {
    "inputs": f'{{"inputs": [{_tensor("TEXT", CARD)}], "inputs": [{_tensor("TEXT", "clean")}]}}',
    "data": f'{{"inputs": [{{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["{CARD}"], '
    '"data": ["clean"]}]}',
    "datatype": f'{{"inputs": [{{"name": "TEXT", "datatype": "BYTES", "datatype": "FP32", "shape": [1], '
    f'"data": ["{CARD}"]}}]}}',
    "parameters": f'{{"parameters": {{"note": "{CARD}"}}, "parameters": {{}}, "inputs": []}}',
    "inputs (as an escape)": f'{{"inputs": [{_tensor("TEXT", CARD)}], "\\u0069nputs": []}}',
}


def test_a_body_with_a_duplicate_key_is_refused_naming_it_on_both_routes(stack: Stack) -> None:
    stack.set_load(500)
    for what, text in DUPLICATES.items():
        key = what.split(" ")[0]
        for name, path in PATHS.items():
            status, upstream_name, answer = _answer(stack, path, text.encode())
            assert (status, upstream_name) == (400, ""), (what, name, status, answer)
            assert answer["error"].startswith(f'duplicate key "{key}" in the JSON body'), (what, name, answer)
    assert not any(CARD.replace(" ", "") in json.dumps(seen).replace(" ", "") for seen in stack.aws.seen)


def test_a_refused_body_gives_its_tenants_slot_back(stack: Stack) -> None:
    """A tenant allowed one request at a time is refused a body with a key twice, again and again,
    and its next request is still decided (not shed for a slot the refusals kept)."""
    stack.set_load(500)
    for name, path in PATHS.items():
        for _ in range(3):
            refused = _answer(stack, path, DUPLICATES["inputs"].encode(), **{"x-tenant": "single"})
            assert refused[:2] == (400, ""), (name, refused)
        clean = _answer(stack, path, _inference("nothing here"), **{"x-tenant": "single"})
        assert clean[:2] == (200, "aws"), (name, clean)


def test_bytes_past_the_declared_binary_tensors_keep_a_request_home_on_both_routes(stack: Stack) -> None:
    stack.set_load(500)
    header = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "parameters": {}}]})
    binary = header.replace('"parameters": {}', '"parameters": {"binary_data_size": 4}')
    before = _counted(stack, "spillway_content_unscannable_total", 'reason="trailing_bytes"')
    for name, path in PATHS.items():
        # As declared: the header alone, or the header and its one 4-byte tensor.
        one = b"\x00\x00\x80?"  # 1.0 as FP32
        for body, length in ((header.encode(), len(header)), (binary.encode() + one, len(binary))):
            sent = _answer(stack, path, body, **{"inference-header-content-length": str(length)})
            assert sent[:2] == (200, "aws"), (name, body, sent)
        for body in (header.encode() + CARD.encode(), binary.encode() + one + CARD.encode()):
            length = len(header) if body.startswith(header.encode()) else len(binary)
            kept = _answer(stack, path, body, **{"inference-header-content-length": str(length)})
            assert kept[:2] == (200, "local"), (name, body, kept)
    assert not any(CARD in json.dumps(seen) for seen in stack.aws.seen)
    wait_until(
        lambda: (
            _counted(stack, "spillway_content_unscannable_total", 'reason="trailing_bytes"') == before + 4
        ),
        10,
        "trailing bytes counted on both routes",
    )


CARDS_SPLIT = {
    "tab": "4111\t1111\t1111\t1111",
    "newline": "4111\n1111\n1111\n1111",
    "CR LF": "4111\r\n1111\r\n1111\r\n1111",
    "no-break space": "4111\u00a01111\u00a01111\u00a01111",
    "thin space": "4111\u20091111\u20091111\u20091111",
    "ideographic space": "4111\u30001111\u30001111\u30001111",
    "zero-width space": "4111\u200b1111\u200b1111\u200b1111",
    "en dash": "4111\u20131111\u20131111\u20131111",
}
ELSEWHERE = {
    "a list-valued parameter": {"parameters": {"notes": ["a", CARD]}, "inputs": []},
    "an object-valued parameter": {"parameters": {"meta": {"card": CARD}}, "inputs": []},
    "a nested input parameter": {
        "inputs": [
            {"name": "X", "datatype": "FP32", "shape": [1], "data": [1], "parameters": {"m": [[CARD]]}}
        ]
    },
    "a parameter's name": {"parameters": {CARD: True}, "inputs": []},
    "an output's nested parameter": {
        "inputs": [],
        "outputs": [{"name": "Y", "parameters": {"m": {"k": [CARD]}}}],
    },
    "an object inside BYTES data": {
        "inputs": [{"name": "T", "datatype": "BYTES", "shape": [1], "data": [{"c": CARD}]}]
    },
    "an IDN e-mail address (local part)": {"parameters": {"to": "jürgen.müller@example.org"}, "inputs": []},
    "an IDN e-mail address (domain)": {"parameters": {"to": "info@bücher.de"}, "inputs": []},
    "an IDN e-mail address (all of it)": {"parameters": {"to": "用户@例子.广告"}, "inputs": []},
}


def test_cards_split_otherwise_nested_text_and_idn_addresses_stay_home_on_both_routes(stack: Stack) -> None:
    stack.set_load(500)
    bodies = {what: _inference("card", text) for what, text in CARDS_SPLIT.items()}
    bodies.update({what: json.dumps(doc, ensure_ascii=False).encode() for what, doc in ELSEWHERE.items()})
    for what, body in bodies.items():
        for name, path in PATHS.items():
            assert _send(stack, path, body) == ("local", "local;residency"), (what, name)


# What a detector matches, as a client might write it.
SECRETS = st.one_of(
    st.builds(
        lambda digits, sep: sep.join(digits[i : i + 4] for i in range(0, 16, 4)),
        st.sampled_from(["4111111111111111", "5500000000000004", "6011000990139424"]),
        st.sampled_from(["", *CARD_SEPARATORS]),
    ),
    st.sampled_from(
        [
            "378282246310005",
            "jane.doe@example.org",
            "jürgen@bücher.de",
            "用户@例子.广告",
            "DE89 3704 0044 0532 0130 00",
            "+44 20 7946 0958",
        ]
    ),
)
# Where Triton reads text: BYTES data, and the request's, an input's and an output's parameters.
PLACES = ("data", "request", "input", "output", "name")


def _nested(value: Any, shape: list[bool]) -> Any:
    """``value`` inside lists (False) and objects (True), outermost last."""
    for in_object in shape:
        value = {"k": value} if in_object else [value]
    return value


def _document(place: str, text: str, shape: list[bool]) -> dict[str, Any]:
    """A KServe v2 request carrying ``text`` at ``place``, ``shape`` deep."""
    value = _nested(text, shape)
    if place == "data":
        tensor = {"name": "T", "datatype": "BYTES", "shape": [1], "data": value if shape else [text]}
        return {"inputs": [tensor]}
    if place == "request":
        return {"parameters": {"p": value}, "inputs": []}
    if place == "input":
        return {
            "inputs": [
                {"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0], "parameters": {"p": value}}
            ]
        }
    if place == "output":
        return {"inputs": [], "outputs": [{"name": "Y", "parameters": {"p": value}}]}
    return {"parameters": {text: True}, "inputs": []}


def _spelt(key: str, escaped: bool) -> str:
    """A key as JSON text, its first character as a \\u escape if ``escaped``."""
    return f'"\\u{ord(key[0]):04x}{key[1:]}"' if escaped else f'"{key}"'


@settings(max_examples=25, deadline=None)
@given(
    secret=SECRETS,
    place=st.sampled_from(PLACES),
    shape=st.lists(st.booleans(), max_size=3),
    how=st.sampled_from(["plain", "duplicated", "trailing"]),
    ascii_only=st.booleans(),
    escaped=st.booleans(),
)
def test_no_detector_match_leaves_wherever_triton_would_read_it(
    stack: Stack, secret: str, place: str, shape: list[bool], how: str, ascii_only: bool, escaped: bool
) -> None:
    """Generated bodies carry a detector's match where Triton reads text, in the first of two
    spellings of a key, or in bytes past the declared binary tensors; none leaves on either route,
    and the same body without the match does."""
    stack.set_load(500)
    carrying, clean = _document(place, secret, shape), _document(place, "nothing here", shape)
    headers: dict[str, str] = {}
    sent = json.dumps(carrying, ensure_ascii=ascii_only).encode()
    control = json.dumps(clean).encode()
    if how == "duplicated":
        key = "outputs" if place == "output" else "inputs" if place in ("data", "input") else "parameters"
        first, second = json.dumps(carrying[key], ensure_ascii=ascii_only), json.dumps(clean[key])
        sent = f'{{"{key}": {first}, {_spelt(key, escaped)}: {second}}}'.encode()
        control = json.dumps({key: clean[key]}).encode()  # the second spelling alone
    elif how == "trailing":
        headers = {"inference-header-content-length": str(len(control))}
        sent = control + secret.encode()
    for name, path in PATHS.items():
        status, upstream_name, answer = _answer(stack, path, sent, **headers)
        assert upstream_name != "aws", (name, sent, answer)
        assert (status, upstream_name) in ((200, "local"), (400, "")), (name, sent, status, answer)
        assert (status == 400) == (how == "duplicated"), (name, sent, status, answer)
        left = _answer(stack, path, control, **headers)
        assert left[:2] == (200, "aws"), (name, control, left)
