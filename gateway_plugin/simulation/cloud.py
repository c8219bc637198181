"""A cloud target as the platform runs it: instances that start cold, take one request each
(Lambda) or ``instance_concurrency`` (FC), are reused while warm and reaped after ``idle_ttl_s``
idle (except those its provisioned concurrency holds), up to the platform's concurrency limit;
every answer crosses the network."""

from __future__ import annotations

import math
import random
from typing import NamedTuple

from gateway_plugin.config import Target
from gateway_plugin.simulation.billing import Bill
from gateway_plugin.simulation.settings import SimulatedTarget


class Instance:
    __slots__ = ("free", "id", "last_used", "pinned", "ready_at")

    def __init__(self, ident: str, slots: int, ready_at: float, pinned: bool = False) -> None:
        self.id = ident
        self.free = slots
        self.ready_at = ready_at
        self.last_used = ready_at
        # Held by provisioned concurrency: never reaped, billed idle for as long as the run.
        self.pinned = pinned


class Served(NamedTuple):
    """Where and when a request sent to the target is answered."""

    done_at: float
    instance: Instance | None
    cold: bool
    ok: bool


def lognormal(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of a lognormal with this mean and coefficient of variation."""
    sigma2 = math.log1p(cv * cv)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


class CloudTarget:
    def __init__(self, target: Target, model: SimulatedTarget, bill: Bill, rng: random.Random) -> None:
        self.name = target.name
        self.idle_ttl_s = target.idle_ttl_s
        self.cap = target.concurrency_cap
        self.slots = model.instance_concurrency or target.instance_concurrency
        self.max_instances = model.max_instances
        self.network_s = model.network_ms / 1000
        self.error_rate = model.error_rate
        idle = model.idle_usd_per_second
        self.idle_usd_per_s = target.cost.usd_per_idle_second if idle is None else idle
        self.service = lognormal(model.service_ms or target.cost.expected_duration_ms, model.service_cv)
        self.cold = lognormal(max(model.cold_start_ms or target.cold_start_ms, 1e-3), model.cold_start_cv)
        self.cold_mean_s = (model.cold_start_ms or target.cold_start_ms) / 1000
        self.bill = bill
        self.rng = rng
        self.ready: list[Instance] = []
        # What the provisioned instances' idle time was billed (the warm-up's, not the requests').
        self.pinned_idle_usd = 0.0
        self.pinned: dict[str, Instance] = {}
        # Provisioned instances still starting: they take requests once up.
        self.coming: list[Instance] = []
        self.live = 0
        self.started = 0
        self.in_flight = 0

    def service_ms(self, z: float, base_ms: float | None = None) -> float:
        """One request's time: the target's own mean with its noise, or a generation's compute
        (``base_ms``) with the same noise, of mean 1."""
        mu, sigma = self.service
        if base_ms is None:
            return math.exp(mu + sigma * z)
        return base_ms * math.exp(sigma * z - sigma * sigma / 2)

    def idle_warm(self, now: float) -> int:
        """Instances with a free slot that would answer without a cold start."""
        self._reap(now)
        return len(self.ready)

    def dispatch(self, now: float, service_ms: float, tokens: int = 0, prompt: int | None = None) -> Served:
        """Run one request (or a warm-up ping holding an instance for ``service_ms``) that
        generates ``tokens`` from a prompt of ``prompt`` tokens (None: not a generation)."""
        self._reap(now)
        cold = False
        if self.ready:
            instance = self.ready[-1]
            self._idle(instance, max(0.0, now - instance.last_used), now)
            instance.free -= 1
            if instance.free == 0:
                self.ready.pop()
        elif self.live >= self.max_instances:
            return Served(now + self.network_s, None, False, False)
        else:
            instance = self._launch(now)
            cold = True
            instance.free -= 1
            if instance.free:
                self.ready.append(instance)
        self.in_flight += 1
        start = max(now + self.network_s / 2, instance.ready_at)
        done = start + service_ms / 1000
        init_ms = (instance.ready_at - now) * 1000 if cold else 0.0
        self.bill.request(self.name, service_ms, init_ms, done, tokens, prompt)
        ok = self.error_rate == 0 or self.rng.random() >= self.error_rate
        return Served(done + self.network_s / 2, instance, cold, ok)

    def prewarm(self, count: int, now: float, pinned: bool = False) -> list[str]:
        """Instances the warm-up has kept warm since before the trace began; ``pinned``: by the
        platform's provisioned concurrency, for the whole run."""
        for _ in range(count):
            self.started += 1
            self.live += 1
            self.ready.append(Instance(f"{self.name}-{self.started}", self.slots, now, pinned))
            if pinned:
                self.pinned[self.ready[-1].id] = self.ready[-1]
        return [i.id for i in self.ready]

    def provision(self, count: int, now: float) -> float:
        """Provisioned concurrency set to ``count``: what it adds starts now, each instance ready
        after a start of its own; what it takes away is let go, reaped once idle past the TTL.
        Returns when the last instance it started is ready."""
        self._reap(now)
        ready_by = now
        while len(self.pinned) > count:
            _, gone = self.pinned.popitem()
            if gone.free == self.slots and gone.ready_at <= now:  # idle: billed as provisioned so far
                self._idle(gone, now - gone.last_used, now)
                gone.last_used = now
            gone.pinned = False
        while len(self.pinned) < count and self.live < self.max_instances:
            instance = self._launch(now)
            instance.pinned = True
            self.pinned[instance.id] = instance
            self.coming.append(instance)
            ready_by = max(ready_by, instance.ready_at)
        return ready_by

    def release(self, instance: Instance, now: float) -> None:
        self.in_flight -= 1
        instance.last_used = now
        if instance.free == 0:
            self.ready.append(instance)
        instance.free += 1

    def _launch(self, now: float) -> Instance:
        mu, sigma = self.cold
        self.started += 1
        self.live += 1
        start_s = math.exp(mu + sigma * self.rng.gauss(0.0, 1.0)) / 1000
        return Instance(f"{self.name}-{self.started}", self.slots, now + self.network_s / 2 + start_s)

    def _reap(self, now: float) -> None:
        """The platform stops instances idle past the TTL (the oldest idle are at the bottom); the
        provisioned ones that have started since join the warm."""
        if self.coming:
            up = [i for i in self.coming if i.ready_at <= now]
            self.coming = [i for i in self.coming if i.ready_at > now]
            self.ready.extend(up)
        ready, horizon = self.ready, now - self.idle_ttl_s
        kept: list[Instance] = []
        while ready and ready[0].last_used < horizon and ready[0].free == self.slots:
            gone = ready.pop(0)
            if gone.pinned:
                kept.append(gone)
                continue
            self.live -= 1
            self.bill.idle(self.name, self.idle_ttl_s * self.idle_usd_per_s, gone.last_used + self.idle_ttl_s)
        ready[:0] = kept

    def close(self, now: float) -> None:
        """The run is over: bill what idle instances cost until then."""
        for instance in self.ready:
            idle = (
                now - instance.last_used
                if instance.pinned
                else min(now - instance.last_used, self.idle_ttl_s)
            )
            self._idle(instance, max(0.0, idle), now)

    def _idle(self, instance: Instance, seconds: float, now: float) -> None:
        usd = seconds * self.idle_usd_per_s
        self.bill.idle(self.name, usd, now)
        if instance.pinned:
            self.pinned_idle_usd += usd
