"""Gateway → function request signing (``X-Spillway-Signature``).

``v1 = hex HMAC-SHA256(key, t \\n n \\n METHOD \\n target \\n hex SHA-256(body))``, where ``target``
is the request target in canonical form (``canonical_target``): the gateway sees nginx's decoded path
and argument table, the function the raw request line, and both must sign the same string. The body
hash may be ``UNSIGNED-PAYLOAD`` where the signer never holds the body; the verifier accepts that
only when told to.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote_to_bytes

from functions.contract import resolved_path

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
MAX_SKEW_S = 300


class SignatureError(Exception):
    """The request's signature is missing, malformed, stale, replayed or wrong (answer 401)."""


_PLAIN_PATH = re.compile(r"(?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)+|/")


def canonical_target(path: bytes, args: Iterable[tuple[bytes, bytes]]) -> str:
    """The target a signature binds: the path decoded once (nginx's ``$uri``), normalised, and the
    decoded arguments sorted,
    every byte outside the unreserved set percent-encoded. An argument without a value reads
    ``name=`` and ``+`` reads as a space, whichever way a server's argument parser takes them."""
    text = path.decode("ascii", "replace")
    if not _PLAIN_PATH.fullmatch(text):
        text = quote(resolved_path(path.decode("latin-1")).encode("latin-1"), safe="/")
    pairs = sorted((k.replace(b"+", b" "), v.replace(b"+", b" ")) for k, v in args)
    if not pairs:
        return text
    return text + "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)


def canonical_of(target: str) -> str:
    """``canonical_target`` of a raw request target (as an HTTP server or a Lambda event gives it)."""
    path, _, query = target.partition("?")
    args = parse_qsl(query, keep_blank_values=True, encoding="latin-1") if query else []
    decoded = unquote_to_bytes(_raw_bytes(path)) if "%" in path else _raw_bytes(path)
    return canonical_target(decoded, [(_raw_bytes(k), _raw_bytes(v)) for k, v in args])


def _raw_bytes(text: str) -> bytes:
    """Servers hand the request line over as latin-1; an event may carry any text."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")


Pieces = Sequence[bytes | bytearray]


def body_digest(body: bytes | Pieces) -> str:
    """A body in pieces is hashed piece by piece, never joined into one copy."""
    if isinstance(body, bytes | bytearray):
        return hashlib.sha256(body).hexdigest()
    digest = hashlib.sha256()
    for part in body:
        digest.update(part)
    return digest.hexdigest()


def _mac(key: bytes, t: str, nonce: str, method: str, path: str, digest: str) -> str:
    message = f"{t}\n{nonce}\n{method.upper()}\n{path}\n{digest}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(
    key: bytes,
    method: str,
    target: str,
    body: bytes | None,
    now: float | None = None,
    nonce: str | None = None,
) -> str:
    """Header value for one request to ``target`` (canonical or raw: both read the same);
    ``body=None`` signs ``UNSIGNED-PAYLOAD``."""
    t = str(int(time.time() if now is None else now))
    n = nonce or secrets.token_hex(12)
    digest = UNSIGNED_PAYLOAD if body is None else body_digest(body)
    return f"t={t},n={n},v1={_mac(key, t, n, method, canonical_of(target), digest)}"


@dataclass(frozen=True)
class ParsedSignature:
    t: int
    nonce: str
    v1: str


MAX_HEADER_LEN = 256
_FIELDS = {
    "t": re.compile(r"[0-9]{1,12}"),
    "n": re.compile(r"[A-Za-z0-9._~-]{1,128}"),
    "v1": re.compile(r"[0-9a-f]{64}"),
}
_MALFORMED = "malformed X-Spillway-Signature: expected t=<unix seconds>,n=<nonce>,v1=<64 hex digits>"


def parse(header: str) -> ParsedSignature:
    """Strict: ASCII only, bounded lengths, each field once; anything else is malformed (401)."""
    if len(header) > MAX_HEADER_LEN or not header.isascii():
        raise SignatureError(_MALFORMED)
    fields: dict[str, str] = {}
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        pattern = _FIELDS.get(name)
        if not sep or pattern is None or name in fields or not pattern.fullmatch(value):
            raise SignatureError(_MALFORMED)
        fields[name] = value
    if len(fields) != len(_FIELDS):
        raise SignatureError(_MALFORMED)
    return ParsedSignature(int(fields["t"]), fields["n"], fields["v1"])


class ReplayCacheFull(Exception):
    """More signed requests inside one window than the cache holds: refuse (503), never forget."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(
            "too many signed requests inside the replay window for this instance; retry later "
            "(or raise SPILLWAY_REPLAY_CACHE_ENTRIES)"
        )
        self.retry_after_s = retry_after_s


class NonceCache:
    """Every nonce until its signature's window has passed, so a replay inside the window is always
    caught. Memory is bounded by ``max_entries`` (about 110 bytes each): the window times the rate
    an instance serves. Per instance: another instance has its own cache."""

    def __init__(self, max_entries: int = 500_000) -> None:
        self._max = max_entries
        self._seen: set[str] = set()
        self._by_expiry: dict[int, list[str]] = defaultdict(list)
        self._swept_to: int | None = None

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, nonce: str, t: int, now: float) -> bool:
        """Record ``nonce`` of a signature made at ``t``; False when it was already seen (a replay)."""
        self._sweep(int(now))
        if nonce in self._seen:
            return False
        if len(self._seen) >= self._max:
            raise ReplayCacheFull(max(1, min(self._by_expiry) - int(now) + 1))
        self._seen.add(nonce)
        self._by_expiry[t + MAX_SKEW_S].append(nonce)
        return True

    def _sweep(self, now_s: int) -> None:
        """Forget the nonces whose signatures can no longer be fresh (expiry before ``now_s``)."""
        start = self._swept_to
        if start is not None and 0 <= now_s - start <= 4 * MAX_SKEW_S:
            seconds: list[int] | range = range(start, now_s)
        else:
            seconds = [s for s in self._by_expiry if s < now_s]
        for second in seconds:
            for nonce in self._by_expiry.pop(second, ()):
                self._seen.discard(nonce)
        self._swept_to = now_s


class Verifier:
    """Checks signatures for one function instance; holds the replay cache."""

    def __init__(self, key: bytes, allow_unsigned_payload: bool = False, max_nonces: int = 500_000) -> None:
        self._key = key
        self._allow_unsigned = allow_unsigned_payload
        self._nonces = NonceCache(max_nonces)

    def verify(self, header: str | None, method: str, target: str, body: bytes | Pieces, now: float) -> None:
        """``target`` as the request carried it; it is compared in canonical form."""
        if not header:
            raise SignatureError("missing X-Spillway-Signature header")
        sig = parse(header)
        if abs(now - sig.t) > MAX_SKEW_S:
            raise SignatureError(
                f"stale X-Spillway-Signature: signed at {sig.t}, now {int(now)} "
                f"(more than {MAX_SKEW_S} s apart; check the gateway's clock)"
            )
        canonical = canonical_of(target)
        candidates = [body_digest(body)]
        if self._allow_unsigned:
            candidates.append(UNSIGNED_PAYLOAD)
        if not any(
            hmac.compare_digest(sig.v1, _mac(self._key, str(sig.t), sig.nonce, method, canonical, digest))
            for digest in candidates
        ):
            raise SignatureError("wrong X-Spillway-Signature: it does not match this request and key")
        if not self._nonces.add(sig.nonce, sig.t, now):
            raise SignatureError("replayed X-Spillway-Signature: this nonce was already used")
