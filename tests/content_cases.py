"""Random request bodies and content settings for the fast path's equivalence test: KServe v2 JSON
(and binary-tensor bodies) whose text inputs hold cards (split by any separator the detector knows,
or by two), IBANs, e-mail addresses (internationalised too) and phone numbers or near misses of
them, in BYTES data and in parameters at any depth, and the malformed JSON that the runner's and the
plugin's decoders could read differently (invalid UTF-8, NUL, lone surrogates, NaN, loose numbers,
nesting at the limit, duplicate keys, bytes past the binary tensors)."""

from __future__ import annotations

import json
import random
import string
from typing import Any

from gateway_plugin.content.checks import MAX_DEPTH
from gateway_plugin.content.syntax import NotPortable, check

# Operator patterns (content_syntax) touching each construct the syntax allows, and the readings
# where engines part: $ before a final newline, \s and \v, ^ after a final newline, nesting.
PATTERNS = (
    r"EMP-[0-9]{6}",
    r"(?i)secret",
    r"^top",
    r"plan$",
    r"\bproj(?:ect)?-[a-f0-9]{4}\b",
    r"[^\x00-\x7f]{3}",
    r"a.c",
    r"\s{2}",
    r"(?s)x.y",
    r"(?m)^z$",
    r"(?:^|[^0-9])7{3}(?:[^0-9]|$)",
    r"\d{3}\.\d",
    r"colou?r|gr[ae]y",
    r"(?i)[A-Z]{2}-\w+?\W",
    r"\Aok\b",
    r"ab[b-d]{2,}",
    r"y\z",
    r"(?m)\n^",
    r"a\Sb",
    r"(a+)+$",
    r"(.*a){3}",
    r"(?i)é",
)
CARDS = (
    "4111111111111111",
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "5500 0000 0000 0004",
    "378282246310005",
    "6011 0009 9013 9424",
    "4111111111111112",
    "1234 5678 9012 3456",
    "4111 1111  1111 1111",
    "order 1234 4111111111111111",
    "4111\t1111\t1111\t1111",
    "4111\u00a01111 1111-1111",
    "4111\r\n1111\r\n1111\r\n1111",
    "4111\u200b1111\u200b1111\u200b1111",
    "4111\u20131111\u20131111\u20131111",
    "4111\t\t1111 1111 1111",
    "4111\n\n1111\n1111\n1111",
)
IBANS = (
    "DE89 3704 0044 0532 0130 00",
    "GB82WEST12345698765432",
    "fr14 2004 1010 0505 0001 3m02 606",
    "DE89 3704 0044 0532 0130 01",
    "IBAN: NL91ABNA0417164300.",
    "XX12 DE89 3704 0044 0532 0130 00",
)
CONTACTS = (
    "a.b@example.org",
    "x@y.co",
    "not an email @ here",
    "user@localhost",
    "+44 20 7946 0958",
    "(555) 123-4567",
    "555-123-4567",
    "020 7946 0958",
    "+1234",
    "+33 6 12 34 56 78",
    "+1234567890123456789",
    "jürgen@bücher.de",
    "用户@例子.广告",
    "josé@localhost",
    "x@y.é",
)
WORDS = (
    "hello",
    "plan\n",
    "grey\n",
    "aaa",
    "aaab",
    "ÉÉ é",
    "the quick brown fox",
    "12",
    "2024-01-15",
    "v1.2.3",
    "",
    "é日本語",
    "😀",
    "EMP-123456",
    "emp-1234567",
    "top secret plan",
    "SeCrEt",
    "proj-beef",
    "project-12ab",
    "x\ny",
    "z\nz",
    "\r\n",
    "a\tb",
    "a\x0bb",
    "777",
    "7777",
    "123.4",
    "grey",
    "AB-cd!",
    "ok go",
    "abd",
)


# Each character the card detector takes as a separator between two digits, and CR LF.
CARD_SEPARATORS = [
    *" -\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\xad\u1680\u180e\u2212\u3000\ufe58\ufe63\uff0d\ufeff",
    *map(chr, range(0x2000, 0x2016)),
    *map(chr, range(0x2028, 0x2030)),
    *map(chr, range(0x205F, 0x2070)),
    "\r\n",
]


# Between a card's digits: what the card detector takes as one separator, and what it does not.
SEPARATORS = " - \t\n\r\x0b\x1f\u0085\u00a0\u00ad\u2009\u200b\u2013\u202f\u2060\u3000\ufeff\uff0d._/\u00b7"


def _digits(rng: random.Random) -> str:
    """13 to 19 random digits split at random by separators, now and then by two (1 in 10 passes
    Luhn)."""
    out = []
    for i in range(rng.randint(11, 20)):
        if i and rng.random() < 0.25:
            out.append(rng.choice(SEPARATORS) * rng.choice((1, 1, 1, 2)))
        out.append(rng.choice(string.digits))
    return "".join(out)


def _iban(rng: random.Random) -> str:
    """An IBAN-like word, its check digits right half of the time, grouped by four or not."""
    country = "".join(rng.choice(string.ascii_uppercase) for _ in range(2))
    bban = "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(rng.randint(10, 24)))
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    check = f"{98 - int(numeric) % 97:02d}" if rng.random() < 0.5 else f"{rng.randint(0, 99):02d}"
    text = country + check + bban
    if rng.random() < 0.5:
        text = " ".join(text[i : i + 4] for i in range(0, len(text), 4))
    return text.lower() if rng.random() < 0.2 else text


def text(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(1, 3)):
        pool = rng.choice((WORDS, WORDS, CARDS, IBANS, CONTACTS, ("digits",), ("iban",), ("random",)))
        piece = rng.choice(pool)
        piece = _digits(rng) if piece == "digits" else _iban(rng) if piece == "iban" else piece
        pieces.append(random_text(rng) if piece == "random" else piece)
    return rng.choice((" ", "", "\n", ", ", "-")).join(pieces)


def _nested(rng: random.Random, depth: int) -> Any:
    data: Any = [text(rng) for _ in range(rng.randint(0, 3))]
    for _ in range(depth):
        data = [data]
    return data


def document(rng: random.Random) -> dict[str, Any]:
    inputs = []
    for i in range(rng.randint(0, 3)):
        datatype = rng.choice(("BYTES", "BYTES", "BYTES", "FP32", "bytes"))
        tensor: dict[str, Any] = {"name": f"in{i}", "datatype": datatype, "shape": [1]}
        if datatype == "FP32":
            tensor["data"] = [rng.random() for _ in range(3)] + [text(rng)] * (rng.random() < 0.2)
        else:
            tensor["data"] = _nested(rng, rng.randint(0, 2))
            if rng.random() < 0.1:
                tensor["data"].append({text(rng): [text(rng)]})
        if rng.random() < 0.3:
            tensor["parameters"] = {"note": text(rng), "n": 3}
        if rng.random() < 0.1:
            tensor["parameters"] = {"list": [1, [text(rng)]], "object": {text(rng): {"deep": text(rng)}}}
        if rng.random() < 0.1:
            tensor["parameters"] = {"binary_data_size": 16}
        inputs.append(tensor)
    doc: dict[str, Any] = {"inputs": inputs}
    if rng.random() < 0.4:
        doc["parameters"] = {"prompt": text(rng), "flag": True, "k": None}
    if rng.random() < 0.2:
        doc["outputs"] = [{"name": "out", "parameters": {"label": text(rng), "binary_data": True}}]
        if rng.random() < 0.3:
            doc["outputs"][0]["parameters"]["nested"] = [{"k": text(rng)}]
    if rng.random() < 0.1:
        doc["id"] = text(rng)
    return doc


def _deep(depth: int) -> str:
    """A value nested so that the document holding it is ``depth`` levels deep."""
    inner = depth - 1  # the document itself is one
    return "[" * inner + '"v"' + "]" * inner


# How a JSON text is spoilt, each a way the two decoders could part (or must agree).
def _spoil(rng: random.Random, encoded: str) -> bytes:
    how = rng.randrange(19)
    raw = encoded.encode()
    if how == 0:
        return raw[: len(raw) // 2] + b"\xff" + raw[len(raw) // 2 :]
    if how == 1:
        return raw.replace(b'"', b'"\x00', 1)
    if how == 2:
        return raw.replace(b'"inputs"', b'"\\ud800inputs"', 1)
    if how == 3:
        return raw + b"x"
    if how == 4:
        return b"[" + raw + b"]"
    if how == 5:
        return raw.replace(b"{", b'{"bad": NaN, ', 1)
    if how == 6:
        return raw.replace(
            b"{", b'{"n": ' + rng.choice((b"1.", b"-.5", b"1.e5", b"01", b"0x10", b"-0")) + b", ", 1
        )
    if how == 7:
        return raw.replace(b"{", b'{"big": ' + b"9" * 5000 + b", ", 1)
    if how == 8:
        depth = rng.choice((MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1))
        return raw.replace(b"{", b'{"deep": ' + _deep(depth).encode() + b", ", 1)
    if how == 9:
        return b"\xef\xbb\xbf" + raw
    if how == 10:
        return raw.replace(b'"', b'"\x01\x1f', 1)
    if how == 11:
        return raw.replace(b"{", b'{"inputs": [{"datatype": "BYTES", "data": ["4111111111111111"]}], ', 1)
    if how == 12:
        return raw.replace(b'"in', b'"\\u0000in', 1)
    if how == 13:
        return raw.replace(b"{", b'{"e": 1e999, "m": -0.0e-5, ', 1)
    if how == 14:
        return b" \t\r\n" + raw + b" \n"
    if how == 15:
        return raw.replace(b'"BYTES"', b'"\\u0042YTES"', 1)
    # A key twice: the first spelling carrying text, written as is or as an escape.
    if how == 16:
        return raw.replace(b"{", b'{"inputs": [{"datatype": "BYTES", "data": ["4111111111111111"]}], ', 1)
    if how == 17:
        return raw.replace(b'"datatype": "BYTES"', b'"datatype": "BYTES", "d\\u0061tatype": "FP32"', 1)
    return raw.replace(b'"parameters": {', b'"parameters": {"p": "a@b.org", "p": "x", ', 1)


def body(rng: random.Random) -> tuple[bytes, dict[str, str]]:
    """A body and the headers that frame it (Content-Length, maybe Inference-Header-Content-Length)."""
    encoded = json.dumps(document(rng), ensure_ascii=rng.random() < 0.3)
    raw = _spoil(rng, encoded) if rng.random() < 0.35 else encoded.encode()
    headers: dict[str, str] = {}
    if rng.random() < 0.15:
        binary = rng.choice((b"4111111111111111", bytes(range(256)), b"\x00" * 16))
        headers["inference-header-content-length"] = rng.choice(
            (str(len(raw)), str(len(raw)), f" {len(raw)} ", str(len(raw) + 1), "abc", f"{len(raw)}, 3", "0")
        )
        raw += binary
    framing = rng.random()
    if framing < 0.8:
        headers["content-length"] = str(len(raw))
    elif framing < 0.9:
        headers["transfer-encoding"] = "chunked"
    return raw, headers


def content_section(rng: random.Random) -> dict[str, Any]:
    built_in = ["card", "iban", "email", "phone"]
    rng.shuffle(built_in)
    return {
        "detectors": built_in[: rng.randint(0, 4)],
        "patterns": {
            **{f"p{i}": p for i, p in enumerate(PATTERNS) if rng.random() < 0.3},
            **{f"r{i}": p for i, p in enumerate(random_patterns(rng, rng.randint(0, 3)))},
        },
        "max_scan_bytes": rng.choice((64, 400, 4096, 65536)),
        "unscannable": rng.choice(("stay_home", "as_labelled")),
        "classify_as": rng.choice(("confidential", " Secret-Content ")),
    }


# Random patterns in the syntax operators may write, over a small alphabet so that they match often.
_ATOMS = (
    "a",
    "b",
    "c",
    "A",
    "-",
    " ",
    "\\n",
    ".",
    "\\d",
    "\\w",
    "\\s",
    "\\W",
    "\\S",
    "\\D",
    "[abc]",
    "[^a]",
    "[a-c]",
    "[\\d ]",
    "[^\\s-]",
    "\\x41",
    "\\.",
    "[\\x80-\\xff]",
)
_POSITIONS = ("^", "$", "\\b", "\\B", "\\A", "\\z")
_QUANTIFIERS = ("*", "+", "?", "{2}", "{0,2}", "{1,}", "{2,3}", "*?", "+?", "??")
_FLAGS = ("", "", "(?i)", "(?m)", "(?s)", "(?ims)")
ALPHABET = "abcAB-1 \n\t\x0b_.é"


def _piece(rng: random.Random, depth: int) -> str:
    roll = rng.random()
    if roll < 0.12:
        return rng.choice(_POSITIONS)
    if roll < 0.16:
        return "é"
    if roll < 0.3 and depth < 3:
        inner = "|".join(_sequence(rng, depth + 1) for _ in range(rng.randint(1, 3)))
        atom = rng.choice(("(", "(?:")) + inner + ")"
    else:
        atom = rng.choice(_ATOMS)
    return atom + (rng.choice(_QUANTIFIERS) if rng.random() < 0.4 else "")


def _sequence(rng: random.Random, depth: int) -> str:
    return "".join(_piece(rng, depth) for _ in range(rng.randint(1, 4)))


def random_pattern(rng: random.Random) -> str:
    """A pattern in the syntax (one content_syntax may still refuse: one that matches the empty
    text, or whose repeats inside repeats multiply too far)."""
    return rng.choice(_FLAGS) + "|".join(_sequence(rng, 0) for _ in range(rng.randint(1, 2)))


def random_patterns(rng: random.Random, count: int) -> list[str]:
    """``count`` random patterns the syntax accepts."""
    found: list[str] = []
    while len(found) < count:
        pattern = random_pattern(rng)
        try:
            check(pattern)
        except NotPortable:
            continue
        found.append(pattern)
    return found


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12)))
