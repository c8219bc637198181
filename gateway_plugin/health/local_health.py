"""Whether the on-prem cluster itself fails, from its answers: a breaker per model.

Missing metrics say only that the gateway cannot see the cluster's load (the fail-safe keeps
everything local); they never say it is down. Its answers do: 5xx, timeouts and refused
connections, as APISIX reports them (``books.outcomes`` on the ext-plugin route, the fast
path's summaries). Closed → open on ``failures_to_open`` failed answers in a row or a failure
share over a window; open for ``open_s`` (doubling on each reopening, up to ``max_open_s``); then
half-open, letting ``probes`` requests through at a time; ``successes_to_close`` probes answered
in a row close it (hysteresis: one lucky answer does not bring the whole load home), a failed one
reopens it.

The metrics endpoints' own refusal corroborates: while every one refuses connections, one failed
answer opens the breaker, and no probe is sent into a host that refuses (until ``max_open_s``,
in case only the metrics port is closed); once it answers again, the probe goes at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gateway_plugin.config import LocalHealth
from gateway_plugin.policy.snapshot import BreakerState

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


@dataclass
class LocalBreaker:
    """One model's (or every model's) breaker; owned by the runner's loop, read through snapshots."""

    state: BreakerState = CLOSED
    consecutive_failures: int = 0
    outcomes: deque[bool] = field(default_factory=deque)
    opened_at: float = 0.0
    open_s: float = 0.0
    probes_in_flight: int = 0
    probed_at: float = float("-inf")
    probe_successes: int = 0
    # When the metrics endpoint was last seen refusing while this breaker was open.
    refused_while_open: bool = False

    def current(self, settings: LocalHealth, now: float, refused: bool) -> BreakerState:
        if self.state is OPEN:
            self.refused_while_open = self.refused_while_open or refused
            waited = now - self.opened_at
            back = self.refused_while_open and not refused
            if back or (waited >= self.open_s and not refused) or waited >= settings.max_open_s:
                self.state = HALF_OPEN
                self.probes_in_flight = 0
                self.probe_successes = 0
        elif self.state is HALF_OPEN and self.probes_in_flight and now - self.probed_at > settings.max_open_s:
            self.probes_in_flight = 0  # a probe whose answer never came back frees its place
        return self.state

    def probe_allowed(self, settings: LocalHealth, now: float, refused: bool) -> bool:
        return self.current(settings, now, refused) is HALF_OPEN and self.probes_in_flight < settings.probes

    def dispatched(self, settings: LocalHealth, now: float, refused: bool) -> None:
        """A request went local; while half-open it is a probe."""
        if self.current(settings, now, refused) is HALF_OPEN:
            self.probes_in_flight += 1
            self.probed_at = now

    def record(self, settings: LocalHealth, ok: bool, now: float, refused: bool) -> None:
        state = self.current(settings, now, refused)
        if state is OPEN:
            return  # answers to requests sent before it opened
        if state is HALF_OPEN:
            self.probes_in_flight = max(0, self.probes_in_flight - 1)
            if not ok:
                self._open(settings, now)
            else:
                self.probe_successes += 1
                if self.probe_successes >= settings.successes_to_close:
                    self._close()
            return
        self.outcomes.append(ok)
        while len(self.outcomes) > settings.window:
            self.outcomes.popleft()
        self.consecutive_failures = 0 if ok else self.consecutive_failures + 1
        if self._tripped(settings, refused):
            self._open(settings, now)

    def _tripped(self, settings: LocalHealth, refused: bool) -> bool:
        if self.consecutive_failures >= (1 if refused else settings.failures_to_open):
            return True
        window = self.outcomes
        return len(window) >= settings.window and window.count(False) / len(window) >= settings.failure_rate

    def _open(self, settings: LocalHealth, now: float) -> None:
        self.open_s = settings.open_s if self.open_s == 0 else min(self.open_s * 2, settings.max_open_s)
        self.state = OPEN
        self.opened_at = now
        self.outcomes.clear()
        self.consecutive_failures = 0
        self.probes_in_flight = 0
        self.refused_while_open = False

    def _close(self) -> None:
        self.state = CLOSED
        self.open_s = 0.0
        self.outcomes.clear()
        self.consecutive_failures = 0
        self.probe_successes = 0
