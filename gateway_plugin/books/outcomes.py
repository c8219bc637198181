"""What happened to each request, reported by APISIX's ``http-logger`` from the log phase.

APISIX's ``ext-plugin-post-resp`` would re-send the request itself (no SNI, no timeouts, the
client's Host), so outcomes come back the way APISIX reports everything else: ``http-logger``
posts batches of log entries whose fields are the ``LOG_FORMAT`` below, nginx variables resolved.
Each entry closes a request's books in the gateway's state: in-flight counts, the target's breaker,
its warm instances, and the cluster's answer time and health (``health.local_health``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from functions.contract import HEADER_COLD, HEADER_INSTANCE, model_of
from gateway_plugin.books.ledger import streamed
from gateway_plugin.books.metrics import Sometimes
from gateway_plugin.books.state import GatewayState
from gateway_plugin.costs import input_tokens
from gateway_plugin.policy.tenants import tenant_key

log = logging.getLogger("spillway.outcomes")
T = TypeVar("T")

MAX_ENTRIES = 10_000
# Entries checked and applied in one turn of the event loop (about 0.5 ms of work), and how many
# may wait for their turn before the rest is applied at once.
SLICE = 64
MAX_PENDING = 4 * MAX_ENTRIES
# A batch forwarded from the parent of several workers to one of them, at most.
MAX_MESSAGE_BYTES = 256 << 10
# The fields of an entry (``log_format``'s names), each checked on its own.
FIELDS = (
    "target",
    "status",
    "upstream_status",
    "upstream",
    "upstream_s",
    "upstream_header_s",
    "request_s",
    "instance",
    "cold",
    "tenant",
    "uri",
    "worker",
    "tokens",
    "body_bytes",
)


# The edge's variables (``spillway/edge.lua`` registers them): the runner's decision as traffic-split
# matches it, the runner worker that made it, the tenant it counted.
UPSTREAM_VAR, WORKER_VAR, TENANT_VAR = "spillway_upstream", "spillway_worker", "spillway_decision_tenant"
# The events of a streamed answer (``text/event-stream``) as the edge counted them going by: a
# stream of generated tokens sends one per token (Triton's generate_stream).
TOKENS_VAR = "spillway_tokens"


def log_format() -> dict[str, str]:
    """The ``log_format`` of the route's ``http-logger``: one outcome per request. The target, the
    deciding worker and the tenant the decision counted are the ``spillway-edge`` plugin's
    variables (the runner's decision, which no client can write): not a header, which the runner
    removes in consumer mode and a cloud target is never sent."""
    return {
        "target": f"${UPSTREAM_VAR}",
        "status": "$status",
        "upstream_status": "$upstream_status",
        "upstream": "$upstream_addr",
        "upstream_s": "$upstream_response_time",
        # Until the answer's first byte: for a stream of generated tokens, its first token.
        "upstream_header_s": "$upstream_header_time",
        "request_s": "$request_time",
        "instance": "$sent_http_" + HEADER_INSTANCE.replace("-", "_"),
        "cold": "$sent_http_" + HEADER_COLD.replace("-", "_"),
        "tenant": f"${TENANT_VAR}",
        "uri": "$uri",
        "worker": f"${WORKER_VAR}",
        "tokens": f"${TOKENS_VAR}",
        # The request body's size as nginx framed it (absent when chunked): a stream's prompt tokens.
        "body_bytes": "$content_length",
    }


# What the route token MACs into the outcome endpoint's Authorization (the fast path's plugin too).
AUTH_LABEL = "spillway-outcomes"


def auth_header(route_token: bytes) -> str:
    """The ``Authorization`` the route's logger sends: only APISIX may report outcomes."""
    return "Spillway " + hmac.new(route_token, AUTH_LABEL.encode(), hashlib.sha256).hexdigest()[:32]


class Outcome(BaseModel):
    """One log entry; every field is an nginx variable, absent when it was unset. APISIX sends the
    numeric ones (``$upstream_response_time``, ``$status``, ...) as JSON numbers. ``invalid``
    names the fields that were there but malformed (read as absent), so whoever applies the entry
    counts them, also after the parent of several workers forwarded it."""

    model_config = ConfigDict(extra="ignore", frozen=True, coerce_numbers_to_str=True)

    target: str | None = Field(default=None, max_length=200)
    status: int | None = Field(default=None, ge=0, le=999)
    upstream_status: str | None = Field(default=None, max_length=200)
    upstream: str | None = Field(default=None, max_length=1000)
    upstream_s: str | None = Field(default=None, max_length=200)
    upstream_header_s: str | None = Field(default=None, max_length=200)
    request_s: str | None = Field(default=None, max_length=200)
    instance: str | None = Field(default=None, max_length=200)
    cold: str | None = Field(default=None, max_length=20)
    # Any length (the body is bounded): kept only as its key, which is what the decision counted.
    tenant: str | None = None
    uri: str | None = Field(default=None, max_length=16384)
    worker: str | None = Field(default=None, max_length=8)
    tokens: str | None = Field(default=None, max_length=20)
    body_bytes: str | None = Field(default=None, max_length=20)
    invalid: tuple[str, ...] = Field(default=(), max_length=len(FIELDS))

    @field_validator("tenant", mode="before")
    @classmethod
    def _keyed(cls, value: object) -> object:
        return tenant_key(value) if isinstance(value, str) else value

    @field_validator("invalid", mode="before")
    @classmethod
    def _known(cls, value: object) -> object:
        return tuple(v for v in value if v in FIELDS) if isinstance(value, list | tuple) else value


class Batch(NamedTuple):
    entries: list[Outcome]
    refused: int
    # Per field, how many entries had it malformed (each read as if the field were absent).
    invalid: dict[str, int]
    first_error: str


def _entry(item: object) -> tuple[Outcome | None, str]:
    """One entry, every malformed field left out and named in ``invalid``; None (and why) only
    when the entry is not a JSON object at all."""
    if not isinstance(item, dict):
        return None, "an entry is not a JSON object"
    try:
        return Outcome.model_validate(item), ""
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False)
    bad = {str(e["loc"][0]) for e in errors if e["loc"]} & set(FIELDS)
    said = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in errors if e["loc"])
    kept = {k: v for k, v in item.items() if k not in bad}
    forwarded = kept.pop("invalid", ())
    if isinstance(forwarded, list):
        bad |= {name for name in forwarded if isinstance(name, str) and name in FIELDS}
    try:
        return Outcome.model_validate({**kept, "invalid": sorted(bad)}), said
    except ValidationError:
        return None, said or "an entry is not an outcome"


def _json(body: bytes) -> object:
    """The body as JSON. nginx passes header bytes as sent and http-logger writes them into its
    JSON unchecked, so bytes that are not UTF-8 are kept as surrogate escapes (a field holding one
    is then malformed, the tenant keyed by the bytes), never the reason to refuse a batch."""
    try:
        return json.loads(body.decode("utf-8", "surrogateescape"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


def entries_of(body: bytes) -> list[object]:
    """A batch's entries as JSON values, not yet checked: a JSON array (or a single entry) of at
    most ``MAX_ENTRIES``, one of them at least a JSON object. Raises ``ValueError`` naming what is
    wrong. Only this is read where the batch is received; its entries are checked where they are
    applied, a slice at a time (``read_entries``), so that no thread holds the interpreter for a
    whole batch while the event loop has requests to answer."""
    parsed = _json(body)
    raw = parsed if isinstance(parsed, list) else [parsed]
    if len(raw) > MAX_ENTRIES:
        raise ValueError(f"{len(raw)} entries in one batch, more than {MAX_ENTRIES}")
    if raw and not any(isinstance(item, dict) for item in raw):
        raise ValueError("no usable entry: no entry is a JSON object")
    return raw


def read_entries(raw: Sequence[object]) -> Batch:
    """Entries checked one by one and within each field by field: clients choose some of the fields
    (the URI, the tenant, the worker header), and one hostile request must cost neither the
    outcomes of every other request in its batch nor the books of its own (a malformed field reads
    as absent)."""
    entries: list[Outcome] = []
    invalid: dict[str, int] = {}
    first_error = ""
    for item in raw:
        entry, error = _entry(item)
        first_error = first_error or error
        if entry is None:
            continue
        entries.append(entry)
        if isinstance(item, dict) and "invalid" not in item:
            for name in entry.invalid:
                invalid[name] = invalid.get(name, 0) + 1
    return Batch(entries, len(raw) - len(entries), invalid, first_error)


class OutcomeWarnings:
    """What was wrong with batches, said at most once a minute of each kind (a client can make every
    request's entry malformed); the metrics count every field and entry."""

    def __init__(self) -> None:
        self.refused, self.malformed = Sometimes(), Sometimes()

    def said(self, batch: Batch) -> None:
        if batch.refused and self.refused.due():
            log.warning(
                "%d of %d outcomes refused, not JSON objects (the rest taken): %s",
                batch.refused,
                batch.refused + len(batch.entries),
                batch.first_error[:200],
            )
        if batch.invalid and self.malformed.due():
            fields = ", ".join(f"{name} x{count}" for name, count in sorted(batch.invalid.items()))
            log.warning(
                "outcome fields malformed and read as absent, the rest of each entry taken: %s (%s); "
                "counted in spillway_outcome_fields_invalid_total, said at most once a minute",
                fields,
                batch.first_error[:300],
            )


def _last_number(raw: str | None) -> float | None:
    """The last of nginx's comma-separated values (one per upstream tried); None when unset or
    not a finite, non-negative number."""
    if not raw:
        return None
    last = raw.rsplit(",", 1)[-1].rsplit(":", 1)[-1].strip()
    try:
        number = float(last)
    except ValueError:
        return None
    return number if 0 <= number < math.inf else None


# How many upstreams one request's answer names at most (APISIX's retries over the nodes).
MAX_ATTEMPTS = 16


def attempts(addresses: str | None, statuses: str | None) -> list[tuple[str, bool]]:
    """Each upstream nginx tried for one request, and whether it answered (a status below 500):
    ``$upstream_addr`` and ``$upstream_status`` list them in the same order, separated by ", "
    (the next node tried) or " : " (an internal redirect)."""
    if not addresses or not statuses:
        return []
    named = _ATTEMPT.split(addresses)[:MAX_ATTEMPTS]
    said = _ATTEMPT.split(statuses)[:MAX_ATTEMPTS]
    tried = []
    for address, status in zip(named, said, strict=False):
        code = status.strip()
        if address and not address.startswith("unix:") and code.isdigit():
            tried.append((address.strip().lower(), 0 < int(code) < 500))
    return tried


_ATTEMPT = re.compile(r", | : ")


def apply(state: GatewayState, outcomes: list[Outcome]) -> None:
    """Close the books of each request that reached an upstream or a function.

    A cloud target's value carries the route token's MAC, so it is the runner's decision; APISIX's
    aws-lambda plugin calls the function itself (no nginx upstream), so there the client's status
    is the function's. Any other request without an upstream status was answered by the gateway
    itself (shed, or invoke mode): its books were closed, or never opened, there.
    """
    for outcome in outcomes:
        for name in outcome.invalid:
            state.outcome_field_invalid(name)
        target = state.target_by_value.get(outcome.target or "")
        upstream_status = _last_number(outcome.upstream_status)
        if upstream_status is None and target is not None and outcome.status:
            upstream_status = float(outcome.status)
        if upstream_status is None:
            continue
        seconds = _last_number(outcome.upstream_s)
        if target is None:
            first_byte = _last_number(outcome.upstream_header_s)
            state.cluster_answered(
                model_of(outcome.uri or ""),
                0 < upstream_status < 500,
                first_byte if first_byte is not None else seconds,
                attempts(outcome.upstream, outcome.upstream_status),
            )
        if seconds is None:
            seconds = _last_number(outcome.request_s)
        stream = streamed(outcome.uri or "")
        cold = outcome.cold == "1"
        tenant = outcome.tenant or None
        ok = 0 < upstream_status < 500
        state.answered(target, tenant, ok, outcome.instance or None, cold, seconds, stream)
        if stream and target is not None:
            tokens, prompt = _last_number(outcome.tokens), input_tokens(_last_number(outcome.body_bytes))
            state.stream_settled(target, tenant, model_of(outcome.uri or ""), seconds, tokens, cold, prompt)


def read_and_apply(state: GatewayState, warnings: OutcomeWarnings, raw: list[object]) -> None:
    """Entries as a batch brought them (``entries_of``): checked, what was wrong said, applied."""
    batch = read_entries(raw)
    warnings.said(batch)
    apply(state, batch.entries)


class SlicedApply(Generic[T]):
    """Batches applied on the event loop a slice at a time, in the order their entries came.

    ``http-logger`` posts up to a thousand entries at once from each APISIX worker; checked and
    applied in one callback (8 µs an entry) they would hold every request the loop has to answer
    meanwhile for milliseconds. Past ``limit`` entries waiting, the rest is applied at once: slower
    for those requests, but nothing is dropped."""

    def __init__(self, apply: Callable[[list[T]], None], size: int = SLICE, limit: int = MAX_PENDING) -> None:
        self._apply, self.size, self.limit = apply, size, limit
        self.pending: deque[T] = deque()
        self._scheduled = False

    def __call__(self, entries: list[T]) -> None:
        """On the loop: the batch queued behind those waiting; a first slice applied now."""
        self.pending.extend(entries)
        if len(self.pending) > self.limit:
            self._take(len(self.pending))
        elif not self._scheduled:
            self._turn()

    def _turn(self) -> None:
        self._scheduled = False
        if not self.pending:  # emptied at once past the limit since this turn was asked for
            return
        self._take(self.size)
        if self.pending:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _take(self, count: int) -> None:
        pending = self.pending
        self._apply([pending.popleft() for _ in range(min(count, len(pending)))])
