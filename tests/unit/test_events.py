"""Typed views over captured event shapes, and the answer shapes the platforms expect."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from functions.contract import WarmupPing, http_api_event, http_api_result, warmup_payload
from functions.core import Response
from functions.events import HttpApiEvent, UnknownEvent, parse_event, to_http_result
from testing.function import load_event


def test_function_url_event_becomes_a_request() -> None:
    event = parse_event(load_event("function_url.json"))
    assert isinstance(event, HttpApiEvent)
    request = event.to_request()
    assert (request.method, request.target) == ("POST", "/v2/models/add_sub/infer")
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.body)["inputs"][0]["name"] == "INPUT0"


def test_http_api_event_keeps_its_query_string() -> None:
    event = parse_event(load_event("http_api_v2.json"))
    assert isinstance(event, HttpApiEvent)
    assert event.target == "/v2/models/add_sub?verbose=1" and event.body == b""


def test_base64_bodies_are_decoded_and_bad_base64_is_named() -> None:
    raw = load_event("function_url.json")
    raw["body"], raw["isBase64Encoded"] = base64.b64encode(b"\x00\xffbinary").decode(), True
    event = parse_event(raw)
    assert isinstance(event, HttpApiEvent) and event.body == b"\x00\xffbinary"
    raw["body"] = "not base64!"
    with pytest.raises(UnknownEvent, match="base64"):
        parse_event(raw).to_request()  # type: ignore[union-attr]


def test_warmup_payloads_from_every_scheduler_are_pings() -> None:
    assert parse_event(load_event("eventbridge_scheduler_warmup.json")) == WarmupPing(
        dwell_ms=250, models=("add_sub",), probe=True
    )
    assert parse_event(load_event("fc_timer.json")) == WarmupPing(models=("add_sub",))
    assert parse_event(warmup_payload(dwell_ms=5)) == WarmupPing(dwell_ms=5)


@pytest.mark.parametrize(
    ("event", "words"),
    [
        ({"Records": []}, "unknown event shape"),
        ([1, 2], "JSON object"),
        (b"{", "not JSON"),
        ({"spillway_warmup": {"dwell_ms": 10**9}}, "dwell_ms"),
        ({"spillway_warmup": {"surprise": 1}}, "surprise"),
        ({"triggerTime": "t", "triggerName": "n", "payload": "not json"}, "not JSON"),
    ],
)
def test_unknown_or_bad_events_name_what_was_wrong(event: object, words: str) -> None:
    with pytest.raises(UnknownEvent, match=words):
        parse_event(event)


def test_text_answers_stay_text_and_binary_answers_go_base64() -> None:
    text = to_http_result(Response(200, [("content-type", "application/json")], b'{"a":1}'))
    assert text == {
        "statusCode": 200,
        "headers": {"content-type": "application/json"},
        "body": '{"a":1}',
        "isBase64Encoded": False,
    }
    binary = to_http_result(
        Response(
            200,
            [("content-type", "application/octet-stream"), ("inference-header-content-length", "2")],
            b"{}\x00\xff",
        )
    )
    assert binary["isBase64Encoded"] is True and base64.b64decode(binary["body"]) == b"{}\x00\xff"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


http_context = st.fixed_dictionaries(
    {"http": st.dictionaries(st.sampled_from(["method", "path"]), json_values)}
)
events = st.dictionaries(
    st.sampled_from(
        [
            "requestContext",
            "spillway_warmup",
            "triggerTime",
            "triggerName",
            "payload",
            "body",
            "rawPath",
            "rawQueryString",
            "headers",
            "isBase64Encoded",
        ]
    ),
    json_values | http_context,
).map(lambda e: {**e, "version": "2.0"} if "requestContext" in e else e)


@given(events)
def test_any_event_is_parsed_or_refused_with_unknown_event(event: dict[str, object]) -> None:
    try:
        parsed = parse_event(event)
        if isinstance(parsed, HttpApiEvent):
            parsed.to_request()
    except UnknownEvent:
        pass
    except (KeyError, TypeError, AttributeError) as exc:
        pytest.fail(f"parse_event leaked {exc!r} for {event!r}")


_TOKEN = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_."), min_size=1, max_size=12)


@given(
    method=st.sampled_from(["GET", "POST", "PUT"]),
    path=st.lists(_TOKEN, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts)),
    query=st.one_of(st.just(""), st.builds(lambda k, v: f"{k}={v}", _TOKEN, _TOKEN)),
    headers=st.dictionaries(_TOKEN.map(str.lower), _TOKEN, max_size=4),
    body=st.binary(max_size=64),
)
def test_the_gateways_invoke_event_reads_back_as_it_was_built_on_the_function(
    method: str, path: str, query: str, headers: dict[str, str], body: bytes
) -> None:
    """Both halves of invoke mode's contract: what the gateway sends, the function reads unchanged."""
    event = parse_event(http_api_event(method, path, query, headers, body))
    assert isinstance(event, HttpApiEvent)
    request = event.to_request()
    target = f"{path}?{query}" if query else path
    assert (request.method, request.target, request.headers, request.body) == (method, target, headers, body)


@given(
    status=st.integers(100, 599),
    headers=st.lists(st.tuples(_TOKEN.map(str.lower), _TOKEN), max_size=4, unique_by=lambda h: h[0]),
    body=st.binary(max_size=64),
    text=st.booleans(),
)
def test_the_functions_answer_reads_back_as_it_was_written_on_the_gateway(
    status: int, headers: list[tuple[str, str]], body: bytes, text: bool
) -> None:
    if text:
        headers = [h for h in headers if h[0] != "content-type"] + [("content-type", "text/plain")]
        body = body.decode("latin-1").encode()
    raw = json.dumps(to_http_result(Response(status, headers, body))).encode()
    assert http_api_result(raw) == (status, headers, body)


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"statusCode": "x"}', b'{"headers": {}}'])
def test_an_answer_that_is_no_function_url_response_is_refused_saying_so(raw: bytes) -> None:
    with pytest.raises(ValueError, match="not a Function URL response"):
        http_api_result(raw)
