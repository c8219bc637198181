"""Spend and request accounting for budgets and tenant quotas (owned by the runner's loop).

Spend is kept in wall-clock hour and day buckets, per target and per tenant; tenant request rates
in a one-minute sliding window; concurrency as in-flight counters. Every map is bounded: targets
by the config, tenants by a cap.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

HOUR, DAY = 3600, 86400
STREAM_SUFFIX = "/generate_stream"
STALE_ANSWERS_S = 20.0
MIN_HORIZON_S = 0.005


class Held(NamedTuple):
    """A stream's price held in the budgets, and the wall time it was held at."""

    usd: float
    wall: float


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

    def add(self, usd: float, now: float, held_at: float | None = None) -> None:
        """``usd`` spent now; less than nothing, given back of what was held at ``held_at`` (None:
        in the windows now), only to a window that still holds it: taken off a window rolled since,
        it would let through more than its budget. Never below nothing."""
        self.roll(now)
        since = now if held_at is None or usd >= 0 else held_at
        if int(since // HOUR) == self.hour:
            self.hour_usd = max(0.0, self.hour_usd + usd)
        if int(since // DAY) == self.day:
            self.day_usd = max(0.0, self.day_usd + usd)


@dataclass
class Outstanding:
    """Dispatches not yet answered, oldest first (answers are anonymous: each closes the oldest).

    Answers may be reported late: APISIX's http-logger sends them in batches, up to a second after
    the fact, and counting a request until then would count a second of traffic as in flight. So
    once answers report how long they took, a dispatch stops counting when it is older than answers
    usually take (``horizon_s``: their smoothed mean plus their smoothed deviation, kept as TCP
    keeps round-trip times); the report that comes for it later closes it, not a dispatch still
    counted. Counting each dispatch for about the mean answer time counts, on average, what is in
    flight (Little's law); a request slower than usual drops out of the count early. Until answers
    report their times, or when none has for ``STALE_ANSWERS_S``, a dispatch counts until
    ``ttl_s``, when its answer is taken as lost.
    """

    ttl_s: float
    started: deque[float] = field(default_factory=deque)
    lapsed: deque[float] = field(default_factory=deque)
    _mean_s: float = 0.0
    _deviation_s: float = 0.0
    _reported_at: float = float("-inf")

    def count(self, now: float) -> int:
        horizon = self.horizon_s(now)
        started, lapsed = self.started, self.lapsed
        while started and started[0] < now - horizon:
            at = started.popleft()
            if at >= now - self.ttl_s:
                lapsed.append(at)
        while lapsed and lapsed[0] < now - self.ttl_s:
            lapsed.popleft()
        return len(started)

    def add(self, now: float) -> None:
        self.started.append(now)

    def done(self, now: float | None = None, seconds: float | None = None) -> None:
        """One answer; ``seconds``, how long it took, when the report says."""
        if self.lapsed:
            self.lapsed.popleft()
        elif self.started:
            self.started.popleft()
        if now is None or seconds is None or seconds < 0:
            return
        if now - self._reported_at > STALE_ANSWERS_S:
            self._mean_s, self._deviation_s = seconds, seconds / 2
        else:
            self._deviation_s += (abs(seconds - self._mean_s) - self._deviation_s) / 4
            self._mean_s += (seconds - self._mean_s) / 8
        self._reported_at = now

    def horizon_s(self, now: float) -> float:
        """How long a dispatch counts as in flight."""
        if now - self._reported_at > STALE_ANSWERS_S:
            return self.ttl_s
        return min(self.ttl_s, max(MIN_HORIZON_S, self._mean_s + self._deviation_s))


class InFlight:
    """Requests in flight in two lanes, each learning its own answer time: a stream of generated
    tokens lasts seconds to minutes, and counted for as long as answers of milliseconds usually
    take it would leave its slot (a target's cap, a tenant's quota) long before it ends."""

    def __init__(self, ttl_s: float) -> None:
        self.answers, self.streams = Outstanding(ttl_s), Outstanding(ttl_s)

    def count(self, now: float) -> int:
        return self.answers.count(now) + self.streams.count(now)

    def add(self, now: float, streamed: bool = False) -> None:
        (self.streams if streamed else self.answers).add(now)

    def done(self, now: float | None = None, seconds: float | None = None, streamed: bool = False) -> None:
        (self.streams if streamed else self.answers).done(now, seconds)

    @property
    def unanswered(self) -> int:
        """Dispatches no answer has closed yet, however old (the shared cap's ``busy``)."""
        return len(self.answers.started) + len(self.streams.started)


class HeldPrices:
    """The prices streams still running were held at in one target's budgets, each its decision's
    own (warm or cold as the decision saw the target's instances) and the wall time it was held at
    (the budgets' windows it is in): a stream's settlement replaces that price, whatever its
    answer's instance then says. Outcomes name no decision, so one takes the oldest price held for
    its tenant. At most ``limit`` are held; one older than ``ttl_s`` (an hour: the budget's window
    it was held in has rolled) was a stream whose outcome never came."""

    def __init__(self, ttl_s: float = HOUR, limit: int = 4096) -> None:
        self.ttl_s = ttl_s
        self.held: deque[tuple[float, str | None, Held]] = deque(maxlen=limit)

    def hold(self, now: float, tenant: str | None, usd: float, wall: float) -> None:
        self._expire(now)
        self.held.append((now, tenant, Held(usd, wall)))

    def take(self, now: float, tenant: str | None) -> Held | None:
        """The oldest price held for ``tenant``'s streams, no longer held; None when none is."""
        self._expire(now)
        for i, (_, whose, held) in enumerate(self.held):
            if whose == tenant:
                del self.held[i]
                return held
        return None

    def _expire(self, now: float) -> None:
        while self.held and self.held[0][0] < now - self.ttl_s:
            self.held.popleft()


def streamed(path: str) -> bool:
    """Whether a request's answer is a stream of generated tokens (Triton's ``generate_stream``)."""
    return path.partition("?")[0].rstrip("/").endswith(STREAM_SUFFIX)


@dataclass
class Ledger:
    """Spend per target, in wall-clock hour and day buckets (the targets come from the config)."""

    _spend: dict[str, _Spend] = field(default_factory=lambda: defaultdict(_Spend))

    def spend(self, key: str, usd: float, now: float, held_at: float | None = None) -> None:
        """``usd`` spent (less than nothing: a stream held at ``held_at`` settled below its price)."""
        self._spend[key].add(usd, now, held_at)

    def spent(self, key: str, now: float) -> tuple[float, float]:
        bucket = self._spend.get(key)
        if bucket is None:
            return 0.0, 0.0
        bucket.roll(now)
        return bucket.hour_usd, bucket.day_usd


@dataclass
class TenantBook:
    """One tenant's spend, arrivals in the last minute and requests in flight. Arrivals are recorded
    only under a rate quota and only while under it, so they never exceed the quota."""

    spend: _Spend
    arrivals: deque[float]
    in_flight: InFlight

    def spent(self, now: float) -> tuple[float, float]:
        self.spend.roll(now)
        return self.spend.hour_usd, self.spend.day_usd

    def add_spend(self, usd: float, now: float, held_at: float | None = None) -> None:
        self.spend.add(usd, now, held_at)

    def last_minute(self, now: float) -> int:
        arrivals = self.arrivals
        while arrivals and arrivals[0] <= now - 60:
            arrivals.popleft()
        return len(arrivals)


class TenantBooks:
    """Books of the tenants a quota applies to, at most ``max_tenants``; the tenant seen least
    recently is forgotten first (it starts afresh), so the tenant header, which clients choose,
    cannot grow the runner's memory."""

    def __init__(self, max_tenants: int = 10_000, in_flight_ttl_s: float = 60.0) -> None:
        self.max_tenants = max_tenants
        self.in_flight_ttl_s = in_flight_ttl_s
        self._books: OrderedDict[str, TenantBook] = OrderedDict()

    def __len__(self) -> int:
        return len(self._books)

    def get(self, tenant: str) -> TenantBook | None:
        return self._books.get(tenant)

    def items(self) -> list[tuple[str, TenantBook]]:
        return list(self._books.items())

    def newest(self) -> Iterator[tuple[str, TenantBook]]:
        """The books, the most recently seen first (read it before anything changes them)."""
        return reversed(self._books.items())

    def seen(self, tenant: str) -> None:
        """A tenant with a book is seen again (its request was shed): it stays among the recent."""
        if tenant in self._books:
            self._books.move_to_end(tenant)

    def book(self, tenant: str) -> TenantBook:
        """The tenant's book, created on first use; marks it as the most recently seen."""
        book = self._books.get(tenant)
        if book is not None:
            self._books.move_to_end(tenant)
            return book
        while len(self._books) >= self.max_tenants:
            self._books.popitem(last=False)
        book = self._books[tenant] = TenantBook(_Spend(), deque(), InFlight(self.in_flight_ttl_s))
        return book
