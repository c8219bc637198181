"""The wire contract every caller of a Spillway function relies on.

The gateway and the warm-up pinger import this module, so it stays free of heavy imports.
"""

from __future__ import annotations

from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field

HEADER_INSTANCE = "x-spillway-instance"
HEADER_COLD = "x-spillway-cold"
HEADER_SIGNATURE = "x-spillway-signature"
HEADER_TARGET = "x-spillway-target"
HEADER_DECISION = "x-spillway-decision"

WARMUP_KEY = "spillway_warmup"
WARMUP_PATH = "/spillway/warmup"
METRICS_PATH = "/spillway/metrics"

MAX_DWELL_MS = 60_000

# The warm-up report file (Prometheus text) names each warm instance in this family, with labels
# ``target`` and ``instance``; the gateway reads its warm pools from it.
WARM_INSTANCE_METRIC = "spillway_warmup_instance"


class WarmupPing(BaseModel):
    """Body of ``{"spillway_warmup": {...}}``: hold the instance, optionally probe the models."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dwell_ms: int = Field(default=0, ge=0, le=MAX_DWELL_MS)
    models: tuple[str, ...] = ()
    probe: bool = False


class WarmupEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    spillway_warmup: WarmupPing


class WarmupReport(BaseModel):
    """What an instance answers to a warm-up ping; the pinger counts distinct ``instance_id``s."""

    model_config = ConfigDict(frozen=True)

    instance_id: str
    cold: bool
    init_ms: float
    uptime_s: float
    triton_ready: bool
    models_ready: tuple[str, ...]


def warmup_payload(dwell_ms: int = 0, models: tuple[str, ...] = (), probe: bool = False) -> str:
    """The exact JSON a scheduler (EventBridge, FC timer, cron) sends to warm an instance."""
    ping = WarmupPing(dwell_ms=dwell_ms, models=models, probe=probe)
    return WarmupEvent(spillway_warmup=ping).model_dump_json()


_MAX_DECODE_ROUNDS = 4


def normalise_path(raw: str) -> str:
    """The one form of a request path that the gateway's rules and the function's allow-list see.

    Percent-escapes are decoded (repeatedly, so double encoding cannot hide a segment), repeated
    slashes merged and dot segments removed (RFC 3986, 5.2.4), so ``//v2/./%72epository`` and
    ``/v2/models/../repository`` both read ``/v2/repository``.
    """
    if raw[:1] == "/" and not ("%" in raw or "//" in raw or "/." in raw or (raw[-1] == "/" and raw != "/")):
        return raw
    path = raw
    for _ in range(_MAX_DECODE_ROUNDS):
        decoded = unquote(path, errors="replace")
        if decoded == path:
            break
        path = decoded
    segments: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    return "/" + "/".join(segments)
