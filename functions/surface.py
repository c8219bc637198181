"""The part of Triton's HTTP API a function serves: inference and generation, metadata,
readiness and health.

Everything else under ``/v2/`` (model repository load/unload, logging, trace, shared-memory
registration, configs, and statistics unless enabled) administers the server, and a client of a
function must never administer its sidecar: those paths get 403 before Triton sees them. Paths
are matched in their normalised form (``contract.normalise_path``), which is also the form
forwarded, so what was checked is what Triton serves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
_ROUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/v2|/v2/health/(?:live|ready)"), "GET"),
    (re.compile(_MODEL + r"(?:/ready)?"), "GET"),
    (re.compile(_MODEL + r"/(?:infer|generate|generate_stream)"), "POST"),
)
_STATISTICS = re.compile(r"/v2/models(?:/[^/]+(?:/versions/[^/]+)?)?/stats")
_CONFIG = re.compile(_MODEL + r"/config")
# What a model name or version may hold once decoded; anything else is no model of this function.
_PATH_CHARS = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/-]*")


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str
    allow: str | None = None


def is_v2(path: str) -> bool:
    """``path`` normalised (``contract.normalise_path``)."""
    return path == "/v2" or path.startswith("/v2/")


_CACHE_ENTRIES = 1024
_CACHE_PATH_CHARS = 256
_decided: dict[tuple[str, str, bool, bool], Refusal | None] = {}


def check(method: str, path: str, expose_statistics: bool, expose_config: bool = False) -> Refusal | None:
    """Why a request for the normalised ``path`` under ``/v2`` is refused; None to forward it.

    Remembered per (method, path): a function serves few paths, so the regular expressions run
    once each. Clients choose the paths, so the memory is bounded twice: only short paths are
    remembered, and the whole memo is forgotten when full.
    """
    if len(path) > _CACHE_PATH_CHARS:
        return _check(method, path, expose_statistics, expose_config)
    key = (method, path, expose_statistics, expose_config)
    try:
        return _decided[key]
    except KeyError:
        pass
    if len(_decided) >= _CACHE_ENTRIES:
        _decided.clear()
    decided = _decided[key] = _check(method, path, expose_statistics, expose_config)
    return decided


def _check(method: str, path: str, expose_statistics: bool, expose_config: bool) -> Refusal | None:
    if not _PATH_CHARS.fullmatch(path):
        return Refusal(400, f"path {path[:200]!r} holds characters no model name or route can hold")
    if _STATISTICS.fullmatch(path):
        if not expose_statistics:
            return Refusal(
                403,
                f"{path} (statistics) is not served by this function; "
                "set SPILLWAY_EXPOSE_STATISTICS=1 on the function to serve it",
            )
        return None if method == "GET" else Refusal(405, f"{method} {path} is not allowed", "GET")
    if _CONFIG.fullmatch(path):
        if not expose_config:
            return Refusal(
                403,
                f"{path} (a model's configuration) is not served by this function; "
                "set SPILLWAY_EXPOSE_MODEL_CONFIG=1 on the function to serve it (read-only)",
            )
        return None if method == "GET" else Refusal(405, f"{method} {path} is not allowed", "GET")
    for pattern, allowed in _ROUTES:
        if pattern.fullmatch(path):
            if method != allowed:
                return Refusal(405, f"{method} {path} is not allowed; use {allowed}", allowed)
            return None
    return Refusal(
        403,
        f"{path} is not served by this function: it serves inference and generation, model "
        "metadata and readiness, and health; the server's administration (repository, configs, "
        "logging, trace, shared memory) stays closed to clients",
    )
