"""``content:``: the detectors that keep a request home by what its text inputs hold, for the routes
and rules that ask for them (``content.checks``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gateway_plugin.config.model import Model
from gateway_plugin.content.program import program

BuiltIn = Literal["card", "iban", "email", "phone"]
ALL_BUILT_IN: list[BuiltIn] = ["card", "iban", "email", "phone"]
DetectorName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
# The most a request's body may be for its text to be read: what APISIX hands the runner in one
# frame is at most 16 MiB, and every byte read is CPU on the request's path.
MAX_SCAN_BYTES = 4 * 1024 * 1024
# The most CPU one request's scan may take, in ms: past it the request stays home.
MAX_SCAN_BUDGET_MS = 10_000


class ContentChecks(Model):
    detectors: list[BuiltIn] = Field(
        default_factory=lambda: list(ALL_BUILT_IN),
        description="built-in detectors, in the order they are tried",
    )
    patterns: dict[DetectorName, str] = Field(
        default_factory=dict,
        description="the operator's detectors: name → regex, tried after the built-ins, over each text "
        "on its own (the syntax both paths read alike, run in linear time; see README)",
    )
    max_scan_bytes: int = Field(
        default=65536, ge=1, le=MAX_SCAN_BYTES, description="bodies larger than this are not read"
    )
    scan_budget_ms: float = Field(
        default=50,
        gt=0,
        le=MAX_SCAN_BUDGET_MS,
        description="the CPU one request's scan (its JSON read and every detector) may take; a scan past "
        "it is stopped and the request stays home (counted as unscannable, over_budget)",
    )
    unscannable: Literal["stay_home", "as_labelled"] = Field(
        default="stay_home",
        description="a body that cannot be read (over max_scan_bytes, of unknown size, not JSON, text in "
        "binary tensors): stay_home keeps it on premises, as_labelled decides by its label alone",
    )
    classify_as: str = Field(
        default="confidential",
        min_length=1,
        max_length=64,
        description="the class a request whose text matched is decided as (never one that may leave)",
    )

    @field_validator("detectors")
    @classmethod
    def _once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a detector is named twice")
        return value

    @field_validator("patterns")
    @classmethod
    def _portable(cls, value: dict[str, str]) -> dict[str, str]:
        for name, pattern in value.items():
            if name in ALL_BUILT_IN:
                raise ValueError(f"pattern {name!r} has a built-in detector's name; name it otherwise")
            try:
                program(pattern)
            except ValueError as exc:
                raise ValueError(f"pattern {name!r}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _class(self) -> ContentChecks:
        if self.classify_as.strip() == "":
            raise ValueError("classify_as must name a class")
        return self
