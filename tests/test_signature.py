"""The X-Spillway-Signature scheme: sign, verify, and every way a signature can be wrong."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from functions.signature import UNSIGNED_PAYLOAD, NonceCache, SignatureError, Verifier, parse, sign

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


def test_nonce_cache_forgets_after_the_window_and_stays_bounded() -> None:
    cache = NonceCache(max_entries=3)
    assert cache.add("a", 0) and not cache.add("a", 1)
    assert cache.add("a", 1000), "a nonce outside the skew window is forgotten"
    for i in range(10):
        cache.add(str(i), 1000)
    assert len(cache._seen) <= 3
