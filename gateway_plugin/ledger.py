"""Spend and request accounting for budgets and tenant quotas (owned by the runner's loop).

Spend is kept in wall-clock hour and day buckets, per target and per tenant; tenant request rates
in a one-minute sliding window; concurrency as in-flight counters.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

HOUR, DAY = 3600, 86400


@dataclass
class _Spend:
    hour: int = -1
    day: int = -1
    hour_usd: float = 0.0
    day_usd: float = 0.0

    def roll(self, now: float) -> None:
        hour, day = int(now // HOUR), int(now // DAY)
        if hour != self.hour:
            self.hour, self.hour_usd = hour, 0.0
        if day != self.day:
            self.day, self.day_usd = day, 0.0


@dataclass
class Outstanding:
    """Dispatches not yet answered; each expires after ``ttl_s`` if its answer is never seen."""

    ttl_s: float
    started: deque[float] = field(default_factory=deque)

    def count(self, now: float) -> int:
        while self.started and self.started[0] < now - self.ttl_s:
            self.started.popleft()
        return len(self.started)

    def add(self, now: float) -> None:
        self.started.append(now)

    def done(self) -> None:
        if self.started:
            self.started.popleft()


@dataclass
class Ledger:
    _spend: dict[str, _Spend] = field(default_factory=lambda: defaultdict(_Spend))
    _arrivals: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque))
    in_flight_ttl_s: float = 60.0
    _in_flight: dict[str, Outstanding] = field(default_factory=dict)

    def spend(self, key: str, usd: float, now: float) -> None:
        bucket = self._spend[key]
        bucket.roll(now)
        bucket.hour_usd += usd
        bucket.day_usd += usd

    def spent(self, key: str, now: float) -> tuple[float, float]:
        bucket = self._spend.get(key)
        if bucket is None:
            return 0.0, 0.0
        bucket.roll(now)
        return bucket.hour_usd, bucket.day_usd

    def arrived(self, key: str, now: float) -> None:
        self._arrivals[key].append(now)

    def last_minute(self, key: str, now: float) -> int:
        arrivals = self._arrivals.get(key)
        if arrivals is None:
            return 0
        while arrivals and arrivals[0] <= now - 60:
            arrivals.popleft()
        return len(arrivals)

    def started(self, key: str, now: float) -> None:
        self._in_flight.setdefault(key, Outstanding(self.in_flight_ttl_s)).add(now)

    def finished(self, key: str) -> None:
        if key in self._in_flight:
            self._in_flight[key].done()

    def in_flight(self, key: str, now: float) -> int:
        outstanding = self._in_flight.get(key)
        return outstanding.count(now) if outstanding else 0
