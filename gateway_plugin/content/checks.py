"""Residency by content: a request whose text inputs hold what a detector looks for stays home.

A label is what the client says of its data; a request labelled ``public`` may still carry an
e-mail address or a card number. On the routes and rules that ask for it (a route's
``content_checks``, a rule's ``content_checks``), the request's text inputs are read and the
detectors (``content_detectors``) run over them; a match makes the request decided as
``content.classify_as``, a class that may not leave, the way ``request_reading.as_decided`` holds a
consumer's requests to its ceiling. So ``decide()`` is handed a classification the request may not
leave with: a match can only keep a request home, never send one out.

The text inputs are those of a KServe v2 JSON request: every string in every ``BYTES`` tensor's
``data`` and in the request's, each input's and each output's ``parameters`` (names and values, at
any depth: a list- or object-valued parameter's strings too). With the binary tensor extension only
the JSON header is read (``Inference-Header-Content-Length`` bytes), the tensors after it skipped;
a ``BYTES`` tensor sent there holds text that is not read, and the body must end where the inputs'
``binary_data_size`` say it does (bytes past them would leave unread). Only what is read is checked:
a body over ``max_scan_bytes``, of unknown size (chunked), not JSON (compressed, malformed, nested
deeper than ``MAX_DEPTH``), with text in binary tensors or bytes other than its tensors declare
follows ``content.unscannable`` (stay home by default). A scan that runs past
``content.scan_budget_ms`` of CPU is stopped and stays home under either setting: what it had not
read yet may hold anything.

A key twice in one object is refused outright (``Verdict.refusal``, a 400): Triton's RapidJSON
reads the first, Python's json and cjson the last, so no reading of such a body is the one the model
server makes. Keys are compared as decoded strings (``"a"`` and ``"\\u0061"`` are one key).

Reading costs CPU on the request's path, so it happens only for a request that would otherwise
leave: the caller decides first and reads only when that decision is a cloud one (a request staying
home anyway has nothing to protect), then decides again. The Lua plugin
(``fast_path/lua/.../spillway/content.lua``) reads the same bytes the same way on the fast path.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.content.detectors import (
    Budget,
    Detector,
    OverBudget,
    built_in,
    first_found,
    pattern_detector,
)
from gateway_plugin.policy.model import Policy
from gateway_plugin.policy.snapshot import RequestFeatures

HEADER_JSON_LENGTH = "inference-header-content-length"
# Deepest nesting of arrays and objects read (a KServe request needs a few levels, one per tensor
# dimension); the fast path's JSON decoder is held to the same.
MAX_DEPTH = 32
_DIGITS = re.compile(rb"[0-9]+")
# The largest binary_data_size read as a size: every whole number up to it is exact as a double,
# which is how the fast path reads JSON numbers.
_MOST_BINARY = 2**53
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class Unscannable(StrEnum):
    """Why a body's text could not be read (the label of ``spillway_content_unscannable_total``)."""

    TOO_LARGE = "too_large"
    UNKNOWN_SIZE = "unknown_size"
    NOT_JSON = "not_json"
    BINARY_TEXT = "binary_text"
    TRAILING_BYTES = "trailing_bytes"
    OVER_BUDGET = "over_budget"


class Verdict(NamedTuple):
    """What reading a request's text found: the first detector that matched, or why the text could
    not be read, or why the body is refused (all None: read, nothing found)."""

    detector: str | None = None
    unscannable: Unscannable | None = None
    refusal: str | None = None

    @property
    def label(self) -> str | None:
        """As the residency log shows it; never the text itself."""
        if self.refusal is not None:
            return f"refused:{self.refusal}"
        if self.detector is not None:
            return self.detector
        return None if self.unscannable is None else f"unscannable:{self.unscannable}"


CLEAN = Verdict()


@dataclass(frozen=True)
class ContentPolicy:
    """``content:`` compiled once: the detectors in the order they are tried, and the rules that ask."""

    detectors: tuple[Detector, ...] = ()
    max_bytes: int = 65536
    unscannable_stays: bool = True
    classify_as: str = "confidential"
    rules: frozenset[str] = frozenset()
    budget_s: float = 0.05

    def keeps_home(self, verdict: Verdict) -> bool:
        """A refused body is kept home too, should a caller decide on it rather than refuse it; a
        scan past its budget stays home under either setting."""
        why = verdict.unscannable
        if verdict.detector is not None or verdict.refusal is not None:
            return True
        return why is not None and (self.unscannable_stays or why is Unscannable.OVER_BUDGET)


def content_policy(config: SpillwayConfig) -> ContentPolicy:
    checks = config.content
    detectors = (
        *(built_in(name) for name in checks.detectors),
        *(pattern_detector(name, pattern) for name, pattern in checks.patterns.items()),
    )
    return ContentPolicy(
        detectors,
        checks.max_scan_bytes,
        checks.unscannable == "stay_home",
        checks.classify_as.strip().lower(),
        frozenset(r.name for r in config.rules if r.content_checks),
        checks.scan_budget_ms / 1000,
    )


@dataclass(frozen=True)
class RouteChecks:
    """Which of a route's requests are read: all of them (the route asks), or those whose deciding
    rule asks."""

    content: ContentPolicy
    every_request: bool
    rules: frozenset[str]

    def applies(self, policy: Policy, features: RequestFeatures) -> bool:
        if self.every_request:
            return True
        rule = next((r for r in policy.rules if r.matches(features)), None)
        return rule is not None and rule.name in self.rules


def route_checks(content: ContentPolicy, policy: Policy, route_asks: bool) -> RouteChecks | None:
    """None when nothing on the route is read (it pays nothing for the feature)."""
    rules = frozenset(r.name for r in policy.rules if r.name in content.rules)
    if not route_asks and not rules:
        return None
    return RouteChecks(content, route_asks, rules)


def tightened(features: RequestFeatures, policy: Policy, content: ContentPolicy) -> RequestFeatures:
    """The request as ``decide()`` is to see it once its text kept it home: of a class that may not leave."""
    return features._replace(headers={**features.headers, policy.classification_header: content.classify_as})


def size_verdict(content: ContentPolicy, declared: int | None) -> Verdict | None:
    """What the body's declared size settles before it is read (None: read it)."""
    if declared is None:
        return Verdict(unscannable=Unscannable.UNKNOWN_SIZE)
    if declared > content.max_bytes:
        return Verdict(unscannable=Unscannable.TOO_LARGE)
    return CLEAN if declared == 0 else None


def body_verdict(
    content: ContentPolicy,
    body: bytes,
    json_length: str | None,
    clock: Callable[[], float] = time.thread_time,
) -> Verdict:
    """What the detectors find in the body's text inputs, within the scan's CPU budget (``clock``:
    this thread's CPU time; the scan never yields, so it is the scan's)."""
    if len(body) > content.max_bytes:
        return Verdict(unscannable=Unscannable.TOO_LARGE)
    budget = Budget(content.budget_s, clock)
    header = json_header(body, json_length)
    read = None if header is None else json_document(header)
    if header is None or read is None:
        return Verdict(unscannable=Unscannable.NOT_JSON)
    document, duplicate = read
    if duplicate is not None:
        return Verdict(refusal=duplicate_key_message(duplicate))
    texts, binary_text = text_inputs(document)
    try:
        budget.read(len(body))
        found = first_found(content.detectors, texts, budget)
    except OverBudget:
        return Verdict(unscannable=Unscannable.OVER_BUDGET)
    if found is not None:
        return Verdict(found)
    if json_length is not None and len(body) - len(header) != binary_bytes(document, len(body)):
        return Verdict(unscannable=Unscannable.TRAILING_BYTES)
    return Verdict(unscannable=Unscannable.BINARY_TEXT) if binary_text else CLEAN


def duplicate_key_message(key: bytes) -> str:
    """The refusal's words, naming the key (its first 64 bytes, printable ASCII as is, every other
    byte as ``\\xhh``), as the fast path words it."""
    shown = "".join(chr(b) if 32 <= b < 127 and b not in b'"\\' else f"\\x{b:02x}" for b in key[:64])
    more = "..." if len(key) > 64 else ""
    return (
        f'duplicate key "{shown}{more}" in the JSON body: Triton reads the first of them, so each key '
        "may appear once in an object"
    )


def binary_bytes(document: dict[str, Any], most: int) -> int | None:
    """How many bytes the binary tensors after the JSON header hold, as Triton sums them: each
    input's ``binary_data_size``; None when one is not a size (a whole number, 0 to 2**53) or the sum
    passes ``most``."""
    inputs = document.get("inputs")
    total = 0
    for tensor in inputs if isinstance(inputs, list) else ():
        parameters = tensor.get("parameters") if isinstance(tensor, dict) else None
        if not isinstance(parameters, dict) or "binary_data_size" not in parameters:
            continue
        size = parameters["binary_data_size"]
        if isinstance(size, bool) or not isinstance(size, int | float):
            return None
        if not (0 <= size <= _MOST_BINARY and float(size).is_integer()):
            return None
        total += int(size)
        if total > most:
            return None
    return total


def json_header(body: bytes, json_length: str | None) -> bytes | None:
    """The JSON part of the body: all of it, or the first ``Inference-Header-Content-Length`` bytes
    (the binary tensors after them are skipped); None when that header is not a size within the body."""
    if json_length is None:
        return body
    value = json_length.strip(" \t").encode("utf-8", "surrogateescape")
    if not _DIGITS.fullmatch(value) or int(value) > len(body):
        return None
    return body[: int(value)]


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


class _Keys:
    """An ``object_pairs_hook`` that keeps the keys it found twice in one object."""

    def __init__(self) -> None:
        self.twice: set[str] = set()

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        made = dict(pairs)
        if len(made) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    self.twice.add(key)
                seen.add(key)
        return made


def _loads(decoded: str, **options: Any) -> tuple[Any, set[str]]:
    keys = _Keys()
    document = json.loads(decoded, strict=False, parse_constant=_refuse, object_pairs_hook=keys, **options)
    return document, keys.twice


def json_document(text: bytes) -> tuple[dict[str, Any], bytes | None] | None:
    """The JSON object ``text`` holds, read as strictly as the fast path's decoder reads it, and the
    smallest key (its UTF-8 bytes) found twice in one of its objects, if any; None when it holds no
    object. UTF-8 only, no NUL byte, no NaN or Infinity, no lone surrogate escape, at most MAX_DEPTH
    levels; control characters inside strings are allowed, as both decoders allow them."""
    if b"\x00" in text:
        return None
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        document, twice = _loads(decoded)
    except RecursionError:
        return None
    except json.JSONDecodeError:
        return None
    except ValueError:  # an integer too long for int(): the fast path reads it as a float
        try:
            document, twice = _loads(decoded, parse_int=float)
        except (ValueError, RecursionError):
            return None
    if not isinstance(document, dict):
        return None
    if _SURROGATE_ESCAPE.search(text) and not _encodable(document):
        return None
    if text.count(b"[") + text.count(b"{") > MAX_DEPTH and _deeper_than(document, MAX_DEPTH):
        return None
    # Every string in the document is UTF-8 now (no lone surrogate), keys too.
    return document, min((k.encode() for k in twice), default=None)


def _encodable(document: dict[str, Any]) -> bool:
    """No string in it holds a lone surrogate (which no UTF-8 holds, and the fast path refuses)."""
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _deeper_than(document: dict[str, Any], limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def _parameters(owner: Mapping[str, Any], texts: list[bytes]) -> None:
    parameters = owner.get("parameters")
    if isinstance(parameters, dict):
        _strings(parameters, texts)


def _strings(data: Any, texts: list[bytes]) -> None:
    """Every string in ``data`` at any depth: list elements, object keys and values."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            texts.append(item.encode())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            texts.extend(k.encode() for k in item)
            stack.extend(item.values())


def text_inputs(document: dict[str, Any]) -> tuple[list[bytes], bool]:
    """The text inputs of a KServe v2 request, and whether a BYTES tensor holds its text in the
    binary part (which is not read)."""
    texts: list[bytes] = []
    binary_text = False
    _parameters(document, texts)
    inputs = document.get("inputs")
    for tensor in inputs if isinstance(inputs, list) else ():
        if not isinstance(tensor, dict):
            continue
        _parameters(tensor, texts)
        if tensor.get("datatype") != "BYTES":
            continue
        parameters = tensor.get("parameters")
        if isinstance(parameters, dict) and "binary_data_size" in parameters:
            binary_text = True
        _strings(tensor.get("data"), texts)
    outputs = document.get("outputs")
    for tensor in outputs if isinstance(outputs, list) else ():
        if isinstance(tensor, dict):
            _parameters(tensor, texts)
    return texts, binary_text
