"""The X-Spillway-Signature scheme: sign, verify, and every way a signature can be wrong."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from functions.signature import (
    MAX_SKEW_S,
    UNSIGNED_PAYLOAD,
    NonceCache,
    ReplayCacheFull,
    SignatureError,
    Verifier,
    canonical_of,
    canonical_target,
    parse,
    sign,
)

KEY = b"k3y"
NOW = 1_800_000_000.0


def test_signature_matches_the_documented_formula() -> None:
    header = sign(KEY, "post", "/v2/models/m/infer?x=1", b"body", now=NOW, nonce="abc")
    message = f"{int(NOW)}\nabc\nPOST\n/v2/models/m/infer?x=1\n{hashlib.sha256(b'body').hexdigest()}"
    expected = hmac.new(KEY, message.encode(), hashlib.sha256).hexdigest()
    assert header == f"t={int(NOW)},n=abc,v1={expected}"


def test_a_good_signature_verifies_once() -> None:
    verifier = Verifier(KEY)
    header = sign(KEY, "POST", "/p", b"b", now=NOW)
    verifier.verify(header, "POST", "/p", b"b", NOW + 10)
    with pytest.raises(SignatureError, match="replayed"):
        verifier.verify(header, "POST", "/p", b"b", NOW + 11)


@pytest.mark.parametrize(
    ("method", "path", "body"), [("GET", "/p", b"b"), ("POST", "/q", b"b"), ("POST", "/p", b"c")]
)
def test_any_change_to_the_request_breaks_the_signature(method: str, path: str, body: bytes) -> None:
    with pytest.raises(SignatureError, match="wrong"):
        Verifier(KEY).verify(sign(KEY, "POST", "/p", b"b", now=NOW), method, path, body, NOW)


@pytest.mark.parametrize("skew", [-301, 301])
def test_stale_signatures_are_refused(skew: int) -> None:
    with pytest.raises(SignatureError, match="stale"):
        Verifier(KEY).verify(sign(KEY, "POST", "/p", b"", now=NOW), "POST", "/p", b"", NOW + skew)


def test_unsigned_payload_only_when_allowed() -> None:
    header = sign(KEY, "POST", "/p", None, now=NOW)
    assert UNSIGNED_PAYLOAD not in header
    with pytest.raises(SignatureError, match="wrong"):
        Verifier(KEY).verify(header, "POST", "/p", b"anything", NOW)
    Verifier(KEY, allow_unsigned_payload=True).verify(header, "POST", "/p", b"anything", NOW)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "t=1",
        "t=1,n=2",
        "t=x,n=a,v1=b",
        "t=1,n=a,v1=b,z=c",
        "t=1,t=2,v1=3",
        "garbage",
        f"t=1,n={'a' * 200},v1=b",
    ],
)
def test_missing_or_malformed_headers_are_refused(header: str | None) -> None:
    with pytest.raises(SignatureError):
        Verifier(KEY).verify(header, "GET", "/", b"", NOW)


@given(st.text(max_size=300))
def test_parsing_any_header_either_works_or_says_why(header: str) -> None:
    try:
        parsed = parse(header)
    except SignatureError as exc:
        assert "X-Spillway-Signature" in str(exc)
    else:
        assert parsed.t >= 0 and parsed.nonce and parsed.v1


def test_nonce_cache_forgets_a_nonce_only_once_its_signature_is_stale() -> None:
    cache = NonceCache(max_entries=3)
    signed_at = 1000
    assert cache.add("a", signed_at, signed_at) and not cache.add("a", signed_at, signed_at + 1)
    assert not cache.add("a", signed_at, signed_at + MAX_SKEW_S), "still inside the window: a replay"
    assert cache.add("a", signed_at, signed_at + MAX_SKEW_S + 1), "past the window: forgotten"


def test_a_full_nonce_cache_refuses_new_requests_rather_than_forget_one() -> None:
    cache = NonceCache(max_entries=3)
    for nonce in "abc":
        cache.add(nonce, 1000, 1000)
    with pytest.raises(ReplayCacheFull) as full:
        cache.add("d", 1000, 1001)
    assert 1 <= full.value.retry_after_s <= MAX_SKEW_S + 1
    assert not cache.add("a", 1000, 1001), "the old nonces are all still known"
    assert cache.add("d", 1100, 1000 + MAX_SKEW_S + 1), "room again once the first signatures are stale"
    assert len(cache) == 1


def test_a_replay_after_200000_other_signed_requests_is_refused() -> None:
    verifier = Verifier(KEY)
    captured = sign(KEY, "POST", "/v2/models/m/infer", b"x", now=NOW, nonce="captured")
    verifier.verify(captured, "POST", "/v2/models/m/infer", b"x", NOW)
    for i in range(200_000):
        header = sign(KEY, "POST", "/p", b"", now=NOW, nonce=f"n{i}")
        verifier.verify(header, "POST", "/p", b"", NOW + i / 1000)
    with pytest.raises(SignatureError, match="replayed"):
        verifier.verify(captured, "POST", "/v2/models/m/infer", b"x", NOW + 250)


@pytest.mark.parametrize(
    "header",
    [
        "t=\u00b2,n=abc,v1=" + "0" * 64,
        "t=" + "9" * 5000 + ",n=abc,v1=" + "0" * 64,
        "t=1,n=abc,v1=" + "\u00e9" * 64,
        "t=1,n=ab\u00e7,v1=" + "0" * 64,
        "t=1,n=abc,v1=" + "0" * 63,
        "t=1,n=abc,v1=" + "A" * 64,
        "t=-1,n=abc,v1=" + "0" * 64,
        "t=1,n=a b,v1=" + "0" * 64,
    ],
)
def test_non_ascii_overlong_or_ill_formed_fields_are_malformed_not_errors(header: str) -> None:
    with pytest.raises(SignatureError, match="malformed"):
        Verifier(KEY).verify(header, "GET", "/", b"", NOW)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("/v2/models/m/infer", "/v2/models/m/infer"),
        ("/v2/models/%6D/infer", "/v2/models/m/infer"),
        ("//v2/./models/x/../m/infer/", "/v2/models/m/infer"),
        # decoded once, as nginx does: what is left is a literal '%' (and refused before serving)
        ("/v2/models/a%253Fb/infer", "/v2/models/a%253Fb/infer"),
        ("/p?b=2&a=x+y&a=%2B&flag&e=", "/p?a=%20&a=x%20y&b=2&e=&flag="),
        ("/p?%E2%9C%93=%C3%A9", "/p?%E2%9C%93=%C3%A9"),
    ],
)
def test_targets_are_signed_in_one_canonical_form(raw: str, canonical: str) -> None:
    assert canonical_of(raw) == canonical
    assert canonical_of(canonical) == canonical
    Verifier(KEY).verify(sign(KEY, "GET", canonical, b"", now=NOW), "GET", raw, b"", NOW)


def test_the_gateways_view_of_a_target_signs_what_the_function_receives() -> None:
    """nginx hands the runner a decoded path (a ``?`` inside it is part of the path) and an
    argument table in no particular order."""
    gateway = canonical_target(b"/v2/models/a?b/infer", [(b"z", b"1"), (b"a", b"x y"), (b"flag", b"")])
    assert gateway == canonical_of("/v2/models/a%3Fb/infer?flag&a=x+y&z=1")


@pytest.mark.parametrize(
    "other",
    ["/v2/models/n/infer", "/v2/models/m/infer?x=1", "/v2/models/m/infer/x", "/v2/models/m/infer?flag"],
)
def test_canonical_form_keeps_different_targets_apart(other: str) -> None:
    with pytest.raises(SignatureError, match="wrong"):
        Verifier(KEY).verify(sign(KEY, "GET", "/v2/models/m/infer", b"", now=NOW), "GET", other, b"", NOW)
