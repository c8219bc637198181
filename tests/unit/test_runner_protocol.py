"""Encoding and decoding of every ext-plugin message against the schema's generated readers."""

from __future__ import annotations

import contextlib

import pytest
from A6.HTTPReqCall.Resp import Resp as HttpReqCallResp
from A6.HTTPReqCall.Rewrite import Rewrite as A6Rewrite
from A6.PrepareConf.Req import Req as PrepareConfReq
from hypothesis import given
from hypothesis import strategies as st

from gateway_plugin.protocol import encode, entry_map, messages, schema
from gateway_plugin.protocol.frames import MAX_PAYLOAD, FrameReader, FrameTooLarge, FrameType, frame
from gateway_plugin.request.header_names import OWN_PREFIX


def test_frame_header_is_type_then_big_endian_length() -> None:
    assert frame(FrameType.HTTP_REQ_CALL, b"abc") == b"\x02\x00\x00\x03abc"
    with pytest.raises(FrameTooLarge):
        frame(1, b"x" * (MAX_PAYLOAD + 1))


@given(st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=300)), max_size=8), st.data())
def test_frames_survive_any_chunking(frames: list[tuple[int, bytes]], data: st.DataObject) -> None:
    stream = b"".join(frame(ty, payload) for ty, payload in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    reader = FrameReader()
    got = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got.extend(reader.feed(stream[start:end]))
    assert got == frames and reader.pending == 0


def test_prepare_conf_round_trip_in_order() -> None:
    payload = encode.prepare_conf("route#1", [("spillway", '{"a": 1}'), ("headers", "{}")])
    assert PrepareConfReq.GetRootAs(payload, 0).Key() == b"route#1"
    assert messages.prepare_conf(payload) == ("route#1", [("spillway", '{"a": 1}'), ("headers", "{}")])
    assert messages.conf_token(encode.prepare_conf_answer(77)) == 77


def test_http_req_call_round_trip_with_non_ascii() -> None:
    payload = encode.req_call(
        9,
        5,
        2,
        "/v2/modèles/infer",
        [("q", "ü"), ("flag", None)],
        [("X-A", "b"), ("x-a", "c")],
        bytes([10, 0, 0, 1]),
    )
    call = messages.HttpReqCall(payload)
    assert (call.id, call.conf_token, call.method, call.path) == (9, 5, "POST", "/v2/modèles/infer")
    assert call.args == [("q", "ü"), ("flag", None)]
    assert call.headers == [("X-A", "b"), ("x-a", "c")]
    assert call.src_ip == "10.0.0.1"
    assert messages.HttpReqCall(encode.req_call(1, 1, 0, "/", [], [], bytes(16))).src_ip == "::"


def test_rewrite_carries_every_field_in_schema_order() -> None:
    payload = encode.rewrite(
        3,
        "/new",
        [("x-keep", "1"), ("cookie", None)],
        [("a", "b")],
        [("x-decision", "aws;overflow")],
        b"\x00new body\xff",
    )
    resp = HttpReqCallResp.GetRootAs(payload, 0)
    assert resp.ActionType() == schema.Action.REWRITE
    table = resp.Action()
    generated = A6Rewrite()
    generated.Init(table.Bytes, table.Pos)
    assert generated.Path() == b"/new" and generated.HeadersLength() == 2
    assert generated.Headers(1).Value() is None
    ident, action = messages.req_call_answer(payload)
    assert ident == 3 and isinstance(action, messages.Rewrite)
    assert action.resp_headers == [("x-decision", "aws;overflow")] and action.body == b"\x00new body\xff"
    assert action.args == [("a", "b")]


_HEADER = st.tuples(
    st.sampled_from(["x-spillway-signature", "x-spillway-target", "traceparent", "accept", "é"]),
    st.one_of(st.none(), st.text(max_size=80)),
)


@given(
    st.integers(0, 2**32 - 1),
    st.lists(_HEADER, max_size=6, unique_by=lambda h: h[0]),
    st.lists(st.sampled_from(["x-spillway-signature", "traceparent", "é", "absent"]), max_size=3),
    st.one_of(st.none(), st.binary(max_size=300)),
)
def test_a_rewrite_with_fresh_values_is_the_one_encoded_whole(
    req_id: int, headers: list[tuple[str, str | None]], fresh: list[str], body: bytes | None
) -> None:
    """A template with its fresh values written over the placeholders: the same bytes as the
    rewrite encoded for this request alone, whatever the values (any length, non-ASCII, none)."""
    resp = [("x-spillway-decision", "aws;overflow")]
    whole = encode._rewrite(req_id, "/p", headers, [], resp, body)
    assert encode.rewrite(req_id, "/p", headers, [], resp, body, fresh=fresh) == whole
    ident, action = messages.req_call_answer(whole)
    assert ident == req_id and isinstance(action, messages.Rewrite) and action.headers == headers


def test_a_fresh_value_does_not_make_a_new_template_per_request() -> None:
    """Signed requests alike share one encoded template; each copy carries its own signature."""
    encode._rewrite_template.cache_clear()
    answers = [
        encode.rewrite(n, None, [("accept", None), ("x-sig", f"t=1,v1={n:064x}")], fresh=("x-sig",))
        for n in range(50)
    ]
    assert encode._rewrite_template.cache_info().currsize == 1
    for n, answer in enumerate(answers):
        ident, action = messages.req_call_answer(answer)
        assert ident == n and isinstance(action, messages.Rewrite)
        assert action.headers == [("accept", None), ("x-sig", f"t=1,v1={n:064x}")]


def test_stop_no_change_and_errors() -> None:
    ident, action = messages.req_call_answer(encode.stop(4, 429, [("retry-after", "1")], b"busy"))
    assert ident == 4 and action == messages.Stop(429, [("retry-after", "1")], b"busy")
    assert messages.req_call_answer(encode.no_change(5)) == (5, None)
    assert messages.err_code(encode.error(2)) == 2 and messages.err_code(encode.error(0)) == 0


def test_resp_call_and_extra_info_round_trips() -> None:
    call = messages.HttpRespCall(encode.resp_call(8, 6, 502, [("content-type", "application/json")]))
    assert (call.id, call.conf_token, call.status, call.headers) == (
        8,
        6,
        502,
        [("content-type", "application/json")],
    )
    answer = messages.resp_call_answer(encode.resp_call_answer(8, 200, [("x-a", "1")], b"body"))
    assert answer == messages.RespCallAnswer(8, 200, [("x-a", "1")], b"body")
    assert messages.extra_info_request(encode.ask_var("route_id")) == (schema.Info.VAR, "route_id")
    assert messages.extra_info_request(encode.ask_req_body()) == (schema.Info.REQ_BODY, None)
    assert messages.extra_info_request(encode.ask_resp_body()) == (schema.Info.RESP_BODY, None)
    assert messages.extra_info_result(encode.extra_info_answer("é\x00".encode())) == "é\x00".encode()
    assert messages.extra_info_result(encode.extra_info_answer(None)) is None


def read_all(call: messages.HttpReqCall) -> None:
    assert isinstance(call.method, str) and isinstance(call.path, str) and isinstance(call.src_ip, str)
    assert isinstance(call.headers, list) and isinstance(call.args, list)


DECODERS = [
    messages.prepare_conf,
    messages.conf_token,
    messages.err_code,
    messages.req_call_answer,
    messages.resp_call_answer,
    messages.extra_info_request,
    messages.extra_info_result,
]


@given(st.binary(max_size=200))
def test_garbage_payloads_raise_only_decode_error(garbage: bytes) -> None:
    for decode in DECODERS:
        with contextlib.suppress(messages.DecodeError):
            decode(garbage)
    with contextlib.suppress(messages.DecodeError):
        read_all(messages.HttpReqCall(garbage))
    with contextlib.suppress(messages.DecodeError):
        assert isinstance(messages.HttpRespCall(garbage).headers, list)


@given(st.binary(min_size=1, max_size=40), st.integers(0, 200))
def test_corrupted_requests_raise_only_decode_error(noise: bytes, at: int) -> None:
    good = bytearray(encode.req_call(1, 2, 2, "/p", [("a", "b")], [("h", "v")], bytes(4)))
    at %= len(good)
    good[at : at + len(noise)] = noise
    with contextlib.suppress(messages.DecodeError):
        read_all(messages.HttpReqCall(bytes(good)))


def test_fast_reader_reads_what_the_generated_builder_writes() -> None:
    """APISIX encodes with the generated builders; build a call that way and read it back."""
    import flatbuffers
    from A6 import TextEntry
    from A6.HTTPReqCall import Req

    b = flatbuffers.Builder(256)
    entries = []
    for name, value in [("x-a", "1"), ("host", "h")]:
        n, v = b.CreateString(name), b.CreateString(value)
        TextEntry.Start(b)
        TextEntry.AddName(b, n)
        TextEntry.AddValue(b, v)
        entries.append(TextEntry.End(b))
    Req.StartHeadersVector(b, len(entries))
    for e in reversed(entries):
        b.PrependUOffsetTRelative(e)
    headers = b.EndVector()
    path = b.CreateString("/v2/x")
    ip = b.CreateByteVector(bytes([127, 0, 0, 1]))
    Req.Start(b)
    Req.AddId(b, 42)
    Req.AddConfToken(b, 7)
    Req.AddSrcIp(b, ip)
    Req.AddPath(b, path)
    Req.AddHeaders(b, headers)
    Req.AddMethod(b, 3)
    b.Finish(Req.End(b))
    call = messages.HttpReqCall(bytes(b.Output()))
    assert (call.id, call.conf_token, call.method, call.path, call.src_ip) == (
        42,
        7,
        "PUT",
        "/v2/x",
        "127.0.0.1",
    )
    assert call.headers == [("x-a", "1"), ("host", "h")] and call.args == []


def test_generated_reader_reads_what_the_fast_writer_writes() -> None:
    from A6.HTTPReqCall.Req import Req

    req = Req.GetRootAs(encode.req_call(42, 7, 3, "/v2/x", [("a", None)], [("x-a", "1")], bytes(4)), 0)
    assert (req.Id(), req.ConfToken(), req.Method(), req.Path()) == (42, 7, 3, b"/v2/x")
    assert (req.Headers(0).Name(), req.Headers(0).Value()) == (b"x-a", b"1")
    assert (req.Args(0).Name(), req.Args(0).Value()) == (b"a", None)


@given(st.lists(st.tuples(st.text(max_size=12), st.text(max_size=12) | st.none()), max_size=8))
def test_header_map_agrees_with_the_entry_list(headers: list[tuple[str, str | None]]) -> None:
    """Names read as nginx's $http_* reads them (any case, ``_`` as ``-``), every value of every
    spelling joined: spellings in sorted order, each one's values in the order they came."""
    call = messages.HttpReqCall(encode.req_call(1, 1, 0, "/", [], headers, bytes(4)))
    by_spelling: dict[str, list[str]] = {}
    for name, value in call.headers:
        if value is not None:
            by_spelling.setdefault(name.lower(), []).append(value)
    joined: dict[str, list[str]] = {}
    spellings: dict[str, list[str]] = {}
    for spelling in sorted(by_spelling, key=lambda n: n.encode("utf-8", "surrogateescape")):
        key = spelling.replace("_", "-")
        joined.setdefault(key, []).extend(by_spelling[spelling])
        spellings.setdefault(key, []).append(spelling)
    assert call.header_map == {k: ", ".join(v) for k, v in joined.items()}
    for key, names in spellings.items():
        assert call.header_map.spellings(key) == ([] if names == [key] else names)
        assert call.header_map.count(key) == len(joined[key])
    # Regular (nothing to settle): every name once, in one spelling, none of Spillway's own.
    regular = all(names == [key] and len(joined[key]) == 1 for key, names in spellings.items()) and not any(
        key.startswith(OWN_PREFIX) for key in joined
    )
    assert call.header_map.regular == regular


def test_a_header_map_with_spillways_own_name_or_a_repeat_is_not_regular() -> None:
    for headers in ([("X-Spillway-Target", "aws")], [("x-a", "1"), ("X-A", "2")], [("x_a", "1")]):
        assert not messages.HttpReqCall(
            encode.req_call(1, 1, 0, "/", [], headers, bytes(4))
        ).header_map.regular
    assert messages.HttpReqCall(
        encode.req_call(1, 1, 0, "/", [], [("x-a", "1")], bytes(4))
    ).header_map.regular
    assert OWN_PREFIX.encode() == entry_map.OWN_PREFIX
