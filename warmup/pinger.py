"""Overlapping pings, in waves, until N distinct instances of a target have answered warm.

Each ping holds its instance for ``dwell_ms``; N pings in flight at once cannot share an
instance, so the platform must answer them from N instances (starting cold ones if it has to).
A wave that finds fewer than N distinct warm instances is followed by another, up to ``waves``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from functions.contract import WarmupReport
from warmup.transports import PingFailed, Transport


@dataclass
class TargetResult:
    target: str
    wanted: int
    warm: dict[str, WarmupReport] = field(default_factory=dict)
    cold: set[str] = field(default_factory=set)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    waves: int = 0
    # Pings sent, every wave's (each is a billed invocation, whether it answered or not).
    pings: int = 0
    # Kept warm by the platform's provisioned concurrency, not by pings (``warm`` is what it allocated).
    provisioned: bool = False

    @property
    def ok(self) -> bool:
        return len(self.warm) >= self.wanted

    @property
    def init_ms(self) -> list[float]:
        return [r.init_ms for i, r in self.warm.items() if i in self.cold]


def is_warm(report: WarmupReport, models: list[str], probe: bool) -> bool:
    if not report.triton_ready:
        return False
    return not (probe and models) or set(models) <= set(report.models_ready)


def warm_target(
    name: str,
    transport: Transport,
    wanted: int,
    payload: str,
    *,
    models: list[str],
    probe: bool,
    waves: int,
    timeout_s: float,
    on_wave: Callable[[TargetResult], None] | None = None,
) -> TargetResult:
    result = TargetResult(name, wanted)
    if wanted <= 0:
        return result
    with ThreadPoolExecutor(max_workers=wanted, thread_name_prefix=f"warm-{name}") as pool:
        while result.waves < waves and not result.ok:
            result.waves += 1
            futures = [pool.submit(transport.ping, payload, timeout_s) for _ in range(wanted)]
            result.pings += len(futures)
            for future in futures:
                try:
                    report = future.result()
                except PingFailed as exc:
                    result.failed += 1
                    if str(exc) not in result.errors:
                        result.errors.append(str(exc))
                    continue
                if report.cold:
                    result.cold.add(report.instance_id)
                if is_warm(report, models, probe):
                    result.warm[report.instance_id] = report
            if on_wave is not None:
                on_wave(result)
    return result


def failed_target(name: str, wanted: int, error: str) -> TargetResult:
    return TargetResult(name, wanted, failed=wanted, errors=[error])
