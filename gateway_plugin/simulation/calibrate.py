"""``simulate --calibrate``: measure the on-prem Triton's service time for the simulator.

Requests go one at a time, so none waits: what each takes is service time plus the HTTP round
trip. Triton's own counters (its metrics endpoint, read before and after) say how much of it was
compute; the rest is the network and Triton's HTTP front, which the simulator adds per request.
"""

from __future__ import annotations

import http.client
import statistics
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from gateway_plugin.signals.load import parse_triton_metrics
from gateway_plugin.signals.members import Counters

MAX_BODY = 64 * 1024 * 1024
WARMUP_REQUESTS = 5


class CalibrationError(RuntimeError):
    """The Triton could not be measured; the message says what it answered and what to check."""


@dataclass(frozen=True)
class Calibration:
    requests: int
    client_mean_ms: float
    client_p99_ms: float
    compute_ms: float | None
    service_cv: float

    @property
    def service_ms(self) -> float:
        return self.compute_ms if self.compute_ms is not None else self.client_mean_ms

    @property
    def network_ms(self) -> float:
        return max(0.0, self.client_mean_ms - self.service_ms)

    def as_settings(self) -> dict[str, float]:
        """The ``simulation.cluster`` fields this measures."""
        return {
            "service_ms": round(self.service_ms, 3),
            "service_cv": round(self.service_cv, 3),
            "network_ms": round(self.network_ms, 3),
        }


def measure(
    url: str,
    metrics_url: str | None,
    model: str,
    body: bytes,
    requests: int,
    timeout_s: float = 30.0,
    progress: Callable[[int], None] | None = None,
) -> Calibration:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CalibrationError(f"{url!r} is not an http(s) URL of a Triton endpoint")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=timeout_s)
    path = f"{parts.path.rstrip('/')}/v2/models/{urllib.parse.quote(model, safe='')}/infer"
    headers = {"content-type": "application/json", "connection": "keep-alive"}
    try:
        for _ in range(WARMUP_REQUESTS):
            _infer(connection, path, body, headers)
        before = _counters(metrics_url, model, timeout_s)
        timings = []
        for done in range(requests):
            started = time.perf_counter()
            _infer(connection, path, body, headers)
            timings.append((time.perf_counter() - started) * 1000)
            if progress is not None:
                progress(done + 1)
        after = _counters(metrics_url, model, timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        raise CalibrationError(f"cannot reach {url}: {exc}; is Triton running there?") from None
    finally:
        connection.close()
    compute = None
    if before is not None and after is not None and after.success > before.success:
        compute = (after.compute_us - before.compute_us) / (after.success - before.success) / 1000
    mean = statistics.fmean(timings)
    cv = statistics.pstdev(timings) / mean if mean > 0 else 0.0
    p99 = sorted(timings)[max(0, -(-99 * len(timings) // 100) - 1)]
    return Calibration(len(timings), mean, p99, compute, cv)


def _infer(connection: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]) -> None:
    connection.request("POST", path, body, headers)
    answer = connection.getresponse()
    data = answer.read(MAX_BODY + 1)
    if answer.status != 200:
        text = data[:300].decode("utf-8", "replace")
        raise CalibrationError(f"Triton answered {answer.status} to {path}: {text}; check --model and --body")
    if len(data) > MAX_BODY:
        raise CalibrationError(f"Triton's answer to {path} is over {MAX_BODY} bytes")


def _counters(metrics_url: str | None, model: str, timeout_s: float) -> Counters | None:
    if not metrics_url:
        return None
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as answer:
            text = answer.read(MAX_BODY).decode("utf-8", "replace")
    except OSError:
        return None
    return parse_triton_metrics(text).get(model)
