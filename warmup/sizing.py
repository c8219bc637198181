"""How many instances each target should keep warm: fixed, by time of day, or from demand.

Adaptive sizing is Little's law: instances busy at once = overflow rate x cloud latency, times
a headroom, clamped to a floor and a ceiling.
"""

from __future__ import annotations

import math
from datetime import time as clock_time

from gateway_plugin.config import WarmTarget, Window


def littles_law(rate_per_s: float, latency_s: float, headroom: float, floor: int, ceiling: int) -> int:
    return max(floor, min(ceiling, math.ceil(rate_per_s * latency_s * headroom)))


def _in_window(window: Window, now: clock_time) -> bool:
    start = clock_time.fromisoformat(window.start)
    end = clock_time(23, 59, 59, 999999) if window.end == "24:00" else clock_time.fromisoformat(window.end)
    if start <= end:
        return start <= now < end
    return now >= start or now < end


def scheduled(spec: WarmTarget, now: clock_time) -> int:
    """The first window containing ``now``, else the fixed count."""
    return next((w.instances for w in spec.windows if _in_window(w, now)), spec.instances)


def wanted(spec: WarmTarget, now: clock_time, overflow_rate_per_s: float | None, latency_s: float) -> int:
    """Adaptive when a rate is known (never below the schedule), else the schedule."""
    base = scheduled(spec, now)
    if spec.adaptive is None or overflow_rate_per_s is None:
        return base
    a = spec.adaptive
    return max(base, littles_law(overflow_rate_per_s, latency_s, a.headroom, a.floor, a.ceiling))
