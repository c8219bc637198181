"""This node's view of the state several gateways share, read on the decision path without I/O.

``GatewayState`` asks the view to adjust the per-target and per-tenant states it builds for each
snapshot: budgets show what this node may still spend (its leases), concurrency caps what it may
still fill (its slots), breakers the state every node agreed on, warm instances those any node
saw. A background round (``shared_sync``) sends what changed and brings back the answers; between
rounds, the view is what the last round said plus what this node did since. Everything here runs
on the runner's event loop, like the rest of the state.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from gateway_plugin.config import SharedState, SpillwayConfig
from gateway_plugin.health.breakers import Breaker
from gateway_plugin.policy.model import SHED, Decision, Policy, Quota
from gateway_plugin.policy.snapshot import BreakerState, TargetState, TenantState
from gateway_plugin.shared.leases import (
    Asked,
    Comeback,
    Lease,
    Limits,
    SharedBreaker,
    Slots,
    lease_block,
    usd_units,
)

log = logging.getLogger("spillway.shared")

HOUR, DAY, MINUTE = 3600, 86400, 60
MAX_WARM_PER_ROUND = 1000
MAX_TENANTS_PER_ROUND = 500
MAX_WARM_SHARED = 10_000


def _tenant_key(tenant: str) -> str:
    """Tenant names come from clients: keys carry a digest, never the name itself."""
    return "tenant:" + hashlib.sha256(tenant.encode()).hexdigest()[:24]


class Round(NamedTuple):
    """One exchange with the store: what is sent, and which of this node's leases and slots each
    line of the answer belongs to; when (``wall``), and whether the node was deciding alone as it
    sent it (``away``: an answer brings it back)."""

    payload: dict[str, Any]
    leases: list[Lease]
    slots: list[Slots]
    wall: float = 0.0
    away: bool = False


class SharedView:
    def __init__(
        self,
        settings: SharedState,
        config: SpillwayConfig,
        policy: Policy,
        node: str,
        share: int | None = None,
    ) -> None:
        self.settings = settings
        self.node = node
        self.share = share or settings.nodes_expected
        self.connected = False
        self.comeback = Comeback(self.share)
        self.wake: Callable[[], None] = lambda: None
        self.breakers: dict[str, SharedBreaker] = {}
        self.targets: dict[str, Limits] = {}
        self.tenants: dict[str, Limits] = {}
        self.dirty: set[str] = set()  # tenants with something to tell the store
        self.warm: dict[str, int] = {}
        self.seen: dict[str, dict[str, int]] = {}
        self.counted_until = 0.0  # wall time until which the store may count what this node holds
        self.apply(config, policy)

    def apply(self, config: SpillwayConfig, policy: Policy) -> None:
        """A new config: limits are rebuilt, what was leased and spent in the window is kept."""
        self.config, self.policy = config, policy
        self.breakers = {n: self.breakers.get(n) or SharedBreaker() for n in policy.targets}
        old = self.targets
        self.targets = {}
        self._dearest = max((usd_units(t.cold_cost_usd) for t in policy.targets.values()), default=1)
        for name, spec in policy.targets.items():
            limits = self.targets[name] = Limits(spec.hourly_usd, spec.daily_usd)
            key = f"target:{name}"
            unit = usd_units(spec.cold_cost_usd)
            limits.hour = self._lease(
                old.get(name, Limits()).hour, key + ":spend:h", HOUR, spec.hourly_usd, unit
            )
            limits.day = self._lease(old.get(name, Limits()).day, key + ":spend:d", DAY, spec.daily_usd, unit)
            limits.slots = self._slots(old.get(name, Limits()).slots, key, spec.concurrency_cap)
        self.warm = {n: self.warm.get(n, 0) for n in policy.targets}
        self.seen = {n: self.seen.get(n, {}) for n in policy.targets}
        old_tenants = list(self.tenants.items())[-config.tenants.max_tracked :]
        self.tenants = {}
        for tenant, old_limits in old_tenants:
            quota = policy.quota_of(tenant)
            if quota.limits_anything:
                self.tenants[tenant] = self._tenant_limits(tenant, quota, old_limits)
        self.dirty &= self.tenants.keys()

    def _lease(
        self,
        old: Lease | None,
        key: str,
        window_s: int,
        usd: float | None,
        unit: int,
        units: int | None = None,
    ) -> Lease | None:
        limit = usd_units(usd) if usd is not None else units
        if limit is None:
            return None
        block = lease_block(limit, self.share, self.settings.lease_share, unit)
        return Lease(key, window_s, limit, block, self.share).carry(old)

    def _slots(self, old: Slots | None, key: str, cap: int | None) -> Slots | None:
        if cap is None:
            return None
        return Slots(key, cap, max(1, cap // (2 * self.share)), self.share).carry(old)

    def _tenant(self, tenant: str, quota: Quota) -> Limits:
        """The tenant's limits; at most ``tenants.max_tracked``, the first seen forgotten first."""
        limits = self.tenants.get(tenant)
        if limits is not None:
            return limits
        while len(self.tenants) >= self.config.tenants.max_tracked:
            forgotten = next(iter(self.tenants))
            del self.tenants[forgotten]
            self.dirty.discard(forgotten)
        limits = self.tenants[tenant] = self._tenant_limits(tenant, quota, Limits())
        return limits

    def _tenant_limits(self, tenant: str, quota: Quota, old: Limits) -> Limits:
        """A tenant's limits under ``quota``, what ``old`` leased and spent in the window kept."""
        limits = Limits(quota.hourly_usd, quota.daily_usd)
        key, dearest = _tenant_key(tenant), self._dearest
        limits.hour = self._lease(old.hour, key + ":spend:h", HOUR, quota.hourly_usd, dearest)
        limits.day = self._lease(old.day, key + ":spend:d", DAY, quota.daily_usd, dearest)
        rpm = quota.requests_per_minute
        limits.minute = self._lease(old.minute, key + ":requests:m", MINUTE, None, 1, rpm)
        limits.slots = self._slots(old.slots, key, quota.concurrency)
        return limits

    # The decision path: plain arithmetic on the last round's answers.

    def target_state(
        self,
        name: str,
        breaker: Breaker,
        in_flight: int,
        warm: int,
        now: float,
        wall: float,
        fast_path: bool = False,
    ) -> TargetState:
        """``in_flight`` and ``warm``: this node's own counts. Budgets show what the runner's own
        decisions may spend, or with ``fast_path`` what the table lets the plugin spend until its
        next fetch (a block, kept out of the runner's part from then on)."""
        limits, shared, connected = self.targets[name], self.breakers[name], self.connected
        state, probe = self._breaker(shared, breaker, now, wall)
        warm = max(warm, self.warm.get(name, 0))
        slots = limits.slots
        if slots is not None:
            shown = in_flight + slots.cap - slots.for_runner(*self._standing(wall))
            warm -= in_flight + (slots.others_busy if connected else 0) - shown
            in_flight = shown
        hour, day = limits.spent_usd(wall, connected, fast_path)
        return TargetState(state, probe, in_flight, warm, hour, day)

    def _breaker(
        self, shared: SharedBreaker, local: Breaker, now: float, wall: float
    ) -> tuple[BreakerState, bool]:
        state = shared.state(wall)
        if self.connected:
            return state, state is BreakerState.HALF_OPEN and shared.probes > 0
        if state is BreakerState.OPEN:
            return state, False
        return local.current(now), local.probe_allowed(now)

    def _spent(self, lease: Lease | None, limit: float | None, local: float, wall: float) -> float:
        """What the policy compares with the limit: the limit less what this node may still spend."""
        if lease is None or limit is None:
            return local
        return limit - lease.remaining(wall, self.connected) / 1e9

    def tenant_state(self, tenant: str, base: TenantState, wall: float) -> TenantState:
        limits = self.tenants.get(tenant)
        if limits is None:
            quota = self.policy.quota_of(tenant)
            if not quota.limits_anything:
                return base
            limits = self._tenant(tenant, quota)
        connected = self.connected
        requests, in_flight = base.requests_last_minute, base.in_flight
        minute, slots = limits.minute, limits.slots
        if minute is not None:
            requests = minute.limit - minute.remaining(wall, connected)
        if slots is not None:
            in_flight += slots.cap - slots.allowed(*self._standing(wall))
        return TenantState(
            requests,
            in_flight,
            self._spent(limits.hour, limits.hour_usd, base.spent_hour_usd, wall),
            self._spent(limits.day, limits.day_usd, base.spent_day_usd, wall),
        )

    # What the node did: leases spent, probes taken, outcomes seen.

    def committed(self, decision: Decision, wall: float, in_flight: int = 0) -> None:
        """A request shed takes nothing (quotas count what was let in, as the node's own books do),
        but its tenant asks the store again: its lease may have run out, or its window rolled."""
        more = False
        tenant = decision.tenant
        tenant_limits = self.tenants.get(tenant) if tenant is not None else None
        if tenant is not None and tenant_limits is not None:
            self.dirty.add(tenant)
        if decision.target == SHED:
            return
        if tenant_limits is not None and tenant_limits.minute is not None:
            more |= tenant_limits.minute.take(1, wall)
        if not decision.is_cloud:
            return self._wake_if(more)
        units = usd_units(decision.cost_usd)
        limits = self.targets[decision.target]
        more |= limits.take_spend(units, wall)
        if tenant_limits is not None:
            more |= tenant_limits.take_spend(units, wall)
        self.breakers[decision.target].dispatched(wall)
        slots = limits.slots
        if (
            slots is not None
            and slots.for_runner(True) - in_flight <= slots.block // 2
            and slots.held < slots.cap
        ):
            more = True
        self._wake_if(more)

    def spent_elsewhere(self, target: str, usd: float, wall: float) -> None:
        """Spend no decision here accounted for (the fast path's), taken from the target's leases
        as a decision's is: the table and every node's budget see it."""
        limits = self.targets.get(target)
        if limits is not None and usd > 0:
            self._wake_if(limits.take_spend(usd_units(usd), wall))

    def tenant_reported(self, tenant: str, arrivals: int, usd: float, wall: float) -> None:
        """A tenant's arrivals and spend the fast path reported, taken from its leases as a
        decision's are."""
        quota = self.policy.quota_of(tenant)
        if quota.limits_anything:
            limits = self._tenant(tenant, quota)
            more = limits.minute is not None and arrivals > 0 and limits.minute.take(arrivals, wall)
            more |= usd > 0 and limits.take_spend(usd_units(usd), wall)
            self.dirty.add(tenant)
            self._wake_if(more)

    def cap(self, target: str, wall: float) -> int | None:
        """The slots of the target's cap this node may fill now, for the gauge (keeps nothing)."""
        slots = self.targets[target].slots
        return None if slots is None else slots.allowed(*self._standing(wall))

    def fast_path_cap(self, target: str, wall: float) -> int | None:
        """The slots the plugin may fill: a block, which the runner leaves alone from now on."""
        slots = self.targets[target].slots
        return None if slots is None else slots.for_fast_path(*self._standing(wall))

    def _standing(self, wall: float) -> tuple[bool, bool]:
        """Whether this node fills the slots the store gave it (connected, settled if back), and
        whether the store may still count them for it (see ``may_have_run``)."""
        together = self.connected and self.comeback.back is None
        return together, self.comeback.reached and wall < self.counted_until

    def _wake_if(self, more: bool) -> None:
        if more and self.connected:
            self.wake()

    def answered(self, target: str, ok: bool, instance: str | None, wall: float, tripped: bool) -> None:
        """After the local breaker recorded the answer: a probe resolved, or the local breaker
        tripped (``tripped``), is told to every node."""
        shared = self.breakers.get(target)
        if shared is None:
            return
        if not shared.outcome(ok) and tripped and shared.state(wall) is not BreakerState.OPEN:
            shared.say("open")
            self.wake()
        elif shared.op is not None:
            self.wake()
        if instance:
            self.instance_seen(target, instance, wall)

    def instance_seen(self, target: str, instance: str, wall: float) -> None:
        seen = self.seen.get(target)
        if seen is not None and (instance in seen or len(seen) < MAX_WARM_PER_ROUND):
            seen[instance] = int(wall * 1000)

    # The rounds.

    def round_request(
        self, wall: float, in_flight: dict[str, int], tenants_in_flight: dict[str, int], release: bool = False
    ) -> Round:
        settings, breaker = self.settings, self.config.breaker
        away = self.comeback.away(self.connected) and not release
        if away:  # every lease tells its claim and holds its share: the tenants' too
            self.dirty.update(self.tenants)
        back = wall if away else self.comeback.back
        asked = Asked()
        for name, limits in self.targets.items():
            asked.add(limits, in_flight.get(name, 0), wall, release, back, always=True)
        dirty = list(self.tenants) if release else list(itertools.islice(self.dirty, MAX_TENANTS_PER_ROUND))
        for tenant in dirty:
            self.dirty.discard(tenant)
            tenant_limits = self.tenants.get(tenant)
            if tenant_limits is not None:
                asked.add(tenant_limits, tenants_in_flight.get(tenant, 0), wall, release, back)
        timeouts = {t.name: t.timeout_s for t in self.config.targets}
        breakers = [
            shared.request(
                name,
                wall,
                breaker.cooldown_s,
                breaker.max_cooldown_s,
                breaker.half_open_probes,
                timeouts[name],
            )
            for name, shared in self.breakers.items()
        ]
        warm = []
        for target_config in self.config.targets:
            seen = self.seen[target_config.name]
            warm.append(
                {
                    "target": target_config.name,
                    "seen": [[k, v] for k, v in seen.items()],
                    "now": int(wall * 1000),
                    "ttl_ms": int(target_config.idle_ttl_s * 1000),
                    "max": MAX_WARM_SHARED,
                }
            )
        payload = {
            "p": "{" + settings.key_prefix + "}",
            "node": self.node,
            "node_ttl_ms": settings.node_ttl_ms,
            "bye": 1 if release else 0,
            "complete": 0 if self.dirty else 1,
            **self.comeback.asked(),
            "leases": asked.leases,
            "slots": asked.slots,
            "breakers": breakers,
            "warm": warm,
        }
        return Round(payload, asked.lease_refs, asked.slot_refs, wall, away)

    def may_have_run(self, sent: Round) -> None:
        """A round that ran on the store (answered, late, unreplicated) renews the node's key there."""
        self.counted_until = max(self.counted_until, sent.wall + self.settings.node_ttl_ms / 1000)

    def round_done(self, sent: Round, reply: list[Any]) -> list[str]:
        """The store's answers, in the order of the request; the targets whose breaker this round
        opened for every node."""
        request, lease_refs, slot_refs, wall, away = sent
        lease_replies, slot_replies, breaker_replies, warm_replies, (now, told, born) = reply
        for lease, asked, (mine, total, before) in zip(
            lease_refs, request["leases"], lease_replies, strict=True
        ):
            window = int(asked["key"].rsplit(":", 1)[1])
            lease.granted(window, int(mine), int(total), int(before), int(asked["hold"]))
        was_back = self.comeback.back is not None
        if self.comeback.answered(wall, away, int(now), int(told), int(born)) and not away:
            self.dirty.update(self.tenants)  # a store that lost them: every claim is told again
            for limits in itertools.chain(self.targets.values(), self.tenants.values()):
                for lease in limits.leases():
                    lease.keep_to_claim()
        elif was_back and self.comeback.back is None:
            self.dirty.update(self.tenants)  # settled: every tenant hands back what it held
        for slots, (held, others_busy) in zip(slot_refs, slot_replies, strict=True):
            slots.granted(int(held), int(others_busy))
        self.may_have_run(sent)
        opened = []
        for asked, (gen, until_ms, cooldown_ms, probes) in zip(
            request["breakers"], breaker_replies, strict=True
        ):
            if self.breakers[asked["target"]].granted(
                asked["op"] or None, int(gen), int(until_ms), int(cooldown_ms), int(probes)
            ):
                opened.append(asked["target"])
        for asked, count in zip(request["warm"], warm_replies, strict=True):
            self.warm[asked["target"]] = int(count)
            seen = self.seen[asked["target"]]
            for instance, at in asked["seen"]:
                if seen.get(instance) == at:
                    del seen[instance]
        return opened
