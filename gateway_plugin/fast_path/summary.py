"""A fast-path worker's summary of outcomes, as the runner reads it: every map bounded, and each
part of an entry checked on its own, so that what clients put in it (a path, a header, a tenant
name) costs at most the part that carries it.
"""

from __future__ import annotations

import json
from itertools import islice
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from gateway_plugin.policy.tenants import tenant_key

MAX_KEYS = 1000
_Count = Annotated[int, Field(ge=0, le=10_000_000)]
_Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# A tenant's spend since the last summary: less than nothing where its streams settled below
# their price at decision (counted then) and nothing else of its was decided since.
_Signed = Annotated[float, Field(allow_inf_nan=False)]
_Text = Annotated[str, Field(max_length=4096)]


class KeptHome(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    path: _Text | None = None
    model: _Text | None = None
    classification: _Text | None = None
    content: _Text | None = None


_COUNT: TypeAdapter[int] = TypeAdapter(_Count)
_AMOUNT: TypeAdapter[float] = TypeAdapter(_Amount)
_SIGNED: TypeAdapter[float] = TypeAdapter(_Signed)
_TEXT: TypeAdapter[str] = TypeAdapter(_Text)
# Per map, each position of an entry's value and whether, malformed, it may read as zero while the
# rest of the entry counts (a cloud answer's seconds, a tenant's spend), or leaves the entry
# unreadable (a count: how many of what is then unknown).
_SHAPES: dict[str, tuple[tuple[TypeAdapter[Any], bool], ...]] = {
    "decisions": ((_COUNT, False),),
    "sent_local": ((_COUNT, False),),
    "on_prem": ((_COUNT, False),),
    "local_s": ((_COUNT, False), (_AMOUNT, False)),
    "local_answers": ((_COUNT, False), (_COUNT, False)),
    "members": ((_COUNT, False), (_COUNT, False), (_COUNT, False)),
    "cloud": ((_COUNT, False), (_COUNT, False), (_AMOUNT, True)),
    "tenants": ((_COUNT, False), (_SIGNED, True)),
    # Requests and spend per "target\ttenant\tmodel"; past the plugin's bound, per target alone.
    "usage": ((_COUNT, False), (_AMOUNT, True)),
    "usage_other": ((_COUNT, False), (_AMOUNT, True)),
}


# The maps keyed by names clients choose (tenants): one past its bound costs only its entries past
# it, so the maps keyed by the config's names (a target's answers, which its breaker reads; the
# cluster's) are read whatever these hold. The plugin bounds them together (spillway/report.lua).
_CHOSEN = frozenset({"tenants", "usage"})


def _value(raw: object, shape: tuple[tuple[TypeAdapter[Any], bool], ...]) -> tuple[Any, int]:
    """An entry's value, malformed optional positions read as zero; None when unreadable. With
    how many positions were malformed or missing."""
    items = [raw] if len(shape) == 1 else raw
    if not isinstance(items, list | tuple) or len(items) > len(shape):
        return None, 1
    out: list[Any] = []
    lost = 0
    for i, (adapter, optional) in enumerate(shape):
        try:
            out.append(adapter.validate_python(items[i]))
        except (ValidationError, IndexError):
            if not optional:
                return None, 1
            out.append(0)
            lost += 1
    return (out[0] if len(shape) == 1 else out), lost


def _valid(adapter: TypeAdapter[Any], item: object) -> bool:
    try:
        adapter.validate_python(item)
    except ValidationError:
        return False
    return True


def _text(raw: object) -> str | None:
    """A text for the residency log: bytes that were not UTF-8 shown as U+FFFD; None when too long
    or not a text."""
    if not isinstance(raw, str):
        return None
    text = raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text if _valid(_TEXT, text) else None


def _entries(name: str, entries: dict[Any, Any]) -> tuple[dict[str, Any], int]:
    """A map's entries, each malformed part costing only itself; with how many parts were lost."""
    kept: dict[str, Any] = {}
    lost = 0
    for raw_key, raw in entries.items():
        if name == "tenants":  # any length: kept as its key, as the plugin keys it
            key = tenant_key(raw_key)
        elif _valid(_TEXT, raw_key):
            key = raw_key
        else:
            lost += 1
            continue
        if name == "instances":
            if not isinstance(raw, dict):
                lost += 1
                continue
            kept[key] = {i: c for i, c in raw.items() if _valid(_TEXT, i) and isinstance(c, bool)}
            lost += len(raw) - len(kept[key])
            continue
        value, malformed = _value(raw, _SHAPES[name])
        lost += malformed
        if value is None:
            continue
        if name == "tenants" and key in kept:  # two names with one key: one tenant
            value = [kept[key][0] + value[0], kept[key][1] + value[1]]
        kept[key] = value
    return kept, lost


def _kept_home(residency: list[Any]) -> tuple[list[dict[str, str | None]], int]:
    kept, lost = [], 0
    for raw in residency:
        if not isinstance(raw, dict):
            lost += 1
            continue
        texts = {name: _text(raw.get(name)) for name in ("path", "model", "classification", "content")}
        lost += sum(1 for name, text in texts.items() if text is None and raw.get(name) is not None)
        kept.append(texts)
    return kept, lost


class FastOutcomes(BaseModel):
    """One worker's summary of what happened since its previous one; every map is bounded.

    A malformed part of an entry costs only itself where the rest still means something: a text
    of a request kept home, an instance id, a cloud answer's seconds or a tenant's spend read as
    absent; an entry whose count is unreadable is dropped. Each lost part is counted in
    ``invalid``; the rest of the summary (breaker results, spend) counts. Tenant names are kept as
    their keys (``policy.tenants``) whatever their length, and a map keyed by them costs only its
    entries past its bound. Only a summary whose shape is wrong, or whose other maps are over their
    bounds, is refused whole.
    """

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    decisions: dict[_Text, _Count] = Field(default_factory=dict, max_length=MAX_KEYS)
    sent_local: dict[_Text, _Count] = Field(default_factory=dict, max_length=MAX_KEYS)
    on_prem: dict[_Text, _Count] = Field(default_factory=dict, max_length=MAX_KEYS)
    # Seconds from the first request ``sent_local`` or ``on_prem`` counts to the summary, over which
    # the runner spreads them (0: not said; all of them count as of now).
    span_s: _Amount = 0.0
    local_s: dict[_Text, tuple[_Count, _Amount]] = Field(default_factory=dict, max_length=MAX_KEYS)
    # Per model, the cluster's answers ok and failed (5xx, timed out, refused): its health.
    local_answers: dict[_Text, tuple[_Count, _Count]] = Field(default_factory=dict, max_length=MAX_KEYS)
    # Per member (APISIX's host:port of the node), its answers ok, failed, and failed since its last
    # ok one: a wedged member.
    members: dict[_Text, tuple[_Count, _Count, _Count]] = Field(default_factory=dict, max_length=MAX_KEYS)
    cloud: dict[_Text, tuple[_Count, _Count, _Amount]] = Field(default_factory=dict, max_length=MAX_KEYS)
    instances: dict[_Text, dict[_Text, bool]] = Field(default_factory=dict, max_length=MAX_KEYS)
    tenants: dict[_Text, tuple[_Count, _Signed]] = Field(default_factory=dict, max_length=MAX_KEYS)
    usage: dict[_Text, tuple[_Count, _Amount]] = Field(default_factory=dict, max_length=MAX_KEYS)
    usage_other: dict[_Text, tuple[_Count, _Amount]] = Field(default_factory=dict, max_length=MAX_KEYS)
    residency: list[KeptHome] = Field(default_factory=list, max_length=MAX_KEYS)
    table_ages: list[_Count] = Field(default_factory=list, max_length=64)
    table_age_sum: _Amount = 0.0
    dropped: _Count = 0
    invalid: _Count = 0

    @classmethod
    def parse(cls, body: bytes) -> FastOutcomes:
        """From a worker's POST body. Texts come from clients (a path, a header) as nginx got their
        bytes: bytes that are not UTF-8 cost the part that carries them, not the summary."""
        try:
            return cls.model_validate(json.loads(body.decode("utf-8", "surrogateescape")))
        except RecursionError:
            raise ValueError("nested too deeply") from None

    @model_validator(mode="before")
    @classmethod
    def _drop_invalid_parts(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        kept: dict[str, Any] = {**data, "invalid": 0}
        invalid = 0
        for name in (*_SHAPES, "instances"):
            entries = data.get(name)
            if name in _CHOSEN and isinstance(entries, dict) and len(entries) > MAX_KEYS:
                invalid += len(entries) - MAX_KEYS
                entries = dict(islice(entries.items(), MAX_KEYS))
            if isinstance(entries, dict) and len(entries) <= MAX_KEYS:
                kept[name], lost = _entries(name, entries)
                invalid += lost
        residency = data.get("residency")
        if isinstance(residency, list) and len(residency) <= MAX_KEYS:
            kept["residency"], lost = _kept_home(residency)
            invalid += lost
        kept["invalid"] = invalid
        return kept
