"""Gateway → function request signing (``X-Spillway-Signature``).

``v1 = hex HMAC-SHA256(key, t \\n n \\n METHOD \\n path \\n hex SHA-256(body))``; ``path`` is the
request target as sent, query string included. The body hash may be ``UNSIGNED-PAYLOAD`` where the
signer never holds the body; the verifier accepts that only when told to.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
MAX_SKEW_S = 300
_MAX_NONCE_LEN = 128


class SignatureError(Exception):
    """The request's signature is missing, malformed, stale, replayed or wrong (answer 401)."""


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _mac(key: bytes, t: str, nonce: str, method: str, path: str, digest: str) -> str:
    message = f"{t}\n{nonce}\n{method.upper()}\n{path}\n{digest}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(
    key: bytes,
    method: str,
    path: str,
    body: bytes | None,
    now: float | None = None,
    nonce: str | None = None,
) -> str:
    """Header value for one request; ``body=None`` signs ``UNSIGNED-PAYLOAD``."""
    t = str(int(time.time() if now is None else now))
    n = nonce or secrets.token_hex(12)
    digest = UNSIGNED_PAYLOAD if body is None else body_digest(body)
    return f"t={t},n={n},v1={_mac(key, t, n, method, path, digest)}"


@dataclass(frozen=True)
class ParsedSignature:
    t: int
    nonce: str
    v1: str


def parse(header: str) -> ParsedSignature:
    fields: dict[str, str] = {}
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not value or name in fields:
            raise SignatureError("malformed X-Spillway-Signature: expected t=<unix>,n=<nonce>,v1=<hex>")
        fields[name] = value
    if set(fields) != {"t", "n", "v1"}:
        raise SignatureError("malformed X-Spillway-Signature: expected exactly the fields t, n and v1")
    if not fields["t"].isdigit():
        raise SignatureError("malformed X-Spillway-Signature: t must be unix seconds")
    if len(fields["n"]) > _MAX_NONCE_LEN:
        raise SignatureError("malformed X-Spillway-Signature: nonce longer than 128 characters")
    return ParsedSignature(int(fields["t"]), fields["n"], fields["v1"])


class NonceCache:
    """Nonces seen within the skew window; bounded so a flood cannot grow it without limit."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._max = max_entries

    def add(self, nonce: str, now: float) -> bool:
        """Record ``nonce``; False when it was already seen (a replay)."""
        while self._seen:
            oldest, seen_at = next(iter(self._seen.items()))
            if now - seen_at <= 2 * MAX_SKEW_S and len(self._seen) < self._max:
                break
            del self._seen[oldest]
        if nonce in self._seen:
            return False
        self._seen[nonce] = now
        return True


class Verifier:
    """Checks signatures for one function instance; holds the replay cache."""

    def __init__(self, key: bytes, allow_unsigned_payload: bool = False) -> None:
        self._key = key
        self._allow_unsigned = allow_unsigned_payload
        self._nonces = NonceCache()

    def verify(self, header: str | None, method: str, path: str, body: bytes, now: float) -> None:
        if not header:
            raise SignatureError("missing X-Spillway-Signature header")
        sig = parse(header)
        if abs(now - sig.t) > MAX_SKEW_S:
            raise SignatureError(
                f"stale X-Spillway-Signature: signed at {sig.t}, now {int(now)} "
                f"(more than {MAX_SKEW_S} s apart; check the gateway's clock)"
            )
        candidates = [body_digest(body)]
        if self._allow_unsigned:
            candidates.append(UNSIGNED_PAYLOAD)
        if not any(
            hmac.compare_digest(sig.v1, _mac(self._key, str(sig.t), sig.nonce, method, path, digest))
            for digest in candidates
        ):
            raise SignatureError("wrong X-Spillway-Signature: it does not match this request and key")
        if not self._nonces.add(sig.nonce, now):
            raise SignatureError("replayed X-Spillway-Signature: this nonce was already used")
