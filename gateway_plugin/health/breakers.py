"""Circuit breakers per cloud target, owned by the runner's event loop (no locks needed).

Closed → open on consecutive failures or a failure rate over a window; open for a cooldown that
doubles each time it reopens (up to a ceiling); then half-open, letting a few probes through; a
probe that succeeds closes it, one that fails reopens it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gateway_plugin.config import BreakerSettings
from gateway_plugin.policy.snapshot import BreakerState

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


@dataclass
class Breaker:
    settings: BreakerSettings
    state: BreakerState = CLOSED
    consecutive_failures: int = 0
    opened_at: float = 0.0
    cooldown_s: float = 0.0
    probes_in_flight: int = 0
    outcomes: deque[bool] = field(default_factory=deque)

    def current(self, now: float) -> BreakerState:
        if self.state == OPEN and now >= self.opened_at + self.cooldown_s:
            self.state = HALF_OPEN
            self.probes_in_flight = 0
        return self.state

    def probe_allowed(self, now: float) -> bool:
        return self.current(now) == HALF_OPEN and self.probes_in_flight < self.settings.half_open_probes

    def dispatched(self, now: float) -> None:
        if self.current(now) == HALF_OPEN:
            self.probes_in_flight += 1

    def record(self, ok: bool, now: float) -> None:
        state = self.current(now)
        if state == HALF_OPEN:
            self.probes_in_flight = max(0, self.probes_in_flight - 1)
            if ok:
                self._close()
            else:
                self._open(now)
            return
        self.outcomes.append(ok)
        if len(self.outcomes) > self.settings.window:
            self.outcomes.popleft()
        self.consecutive_failures = 0 if ok else self.consecutive_failures + 1
        if state == CLOSED and self._tripped():
            self._open(now)

    def _tripped(self) -> bool:
        if self.consecutive_failures >= self.settings.consecutive_failures:
            return True
        window = self.outcomes
        return (
            len(window) >= self.settings.window
            and window.count(False) / len(window) >= self.settings.failure_rate
        )

    def _open(self, now: float) -> None:
        """Even a group of one target cools down; each reopening doubles the cooldown."""
        self.cooldown_s = (
            self.settings.cooldown_s
            if self.cooldown_s == 0
            else min(self.cooldown_s * 2, self.settings.max_cooldown_s)
        )
        self.state = OPEN
        self.opened_at = now
        self.outcomes.clear()
        self.consecutive_failures = 0

    def _close(self) -> None:
        self.state = CLOSED
        self.cooldown_s = 0.0
        self.outcomes.clear()
        self.consecutive_failures = 0


class RetryBudget:
    """Retries allowed as a share of recent requests, so retries cannot multiply an outage."""

    def __init__(self, ratio: float, window: int = 100) -> None:
        self.ratio = ratio
        self._requests: deque[bool] = deque(maxlen=window)

    def request(self, is_retry: bool) -> None:
        self._requests.append(is_retry)

    def allows_retry(self) -> bool:
        """Only if, with this retry, retries stay within ``ratio`` of the recent requests."""
        return (sum(self._requests) + 1) <= self.ratio * (len(self._requests) + 1)
