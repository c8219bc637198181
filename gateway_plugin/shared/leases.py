"""The arithmetic of state shared by several gateways: leased limits, held slots, a shared breaker.

Each node decides from its own view and never waits on the shared store; the store hands out
shares of each limit ahead of use, so no two nodes can spend the same unit:

- ``Lease``: a windowed limit (a budget in nano-dollars, requests per minute). A node is leased
  blocks of it; it may spend what it was leased. All leases together never exceed the limit, so
  while the store answers the limit holds exactly. Away from the store, a node may also spend
  ``1/share`` of what was left at its last round (its alone share); back, it claims what it spent
  beyond its leases. Claims are a node's own field, set to the larger value, never added, so a
  claim sent twice (a reply lost) counts once. A node back is leased nothing more until every
  node has told the store its claims since (the others may have spent their alone shares, which
  a store that lost its data, or never heard of them, cannot count); meanwhile it goes on with
  its own alone share and holds in the store what it has not spent of it, so that no one else is
  leased that either. Settled, it keeps a block of that share at most and gives back the rest.
- ``Slots``: a concurrency cap. A node holds slots, all nodes together at most the cap, and
  dispatches only while its in-flight count is under what it holds; away, it fills ``cap //
  share`` (at least one), the others the rest, and, for as long as the store may still count its
  slots, no more than it held there. A node whose fast path fills slots too (the plugin counts its
  in-flight requests in APISIX, out of the runner's sight) keeps a block of them for it.
- ``SharedBreaker``: the breaker state every node reads (generation, open until, cooldown) and the
  half-open probe tokens this node was given; a node that trips its own breaker says so at once in
  its view and in the next round.

Plain values, no I/O: ``shared_state`` builds the rounds, the store runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway_plugin.policy.snapshot import BreakerState

NANO_USD = 1_000_000_000


def usd_units(usd: float) -> int:
    """Nano-dollars, rounded up: a budget is never under-counted."""
    return -int(-usd * NANO_USD // 1)


def lease_block(limit: int, share: int, lease_share: float, unit: int) -> int:
    """A lease's block: ``lease_share`` of the limit, and at least two of the dearest requests, so
    that asking at half a block always leaves room for one."""
    return max(2 * unit, int(limit * lease_share), limit // (share * 64))


@dataclass
class Lease:
    key: str
    window_s: int
    limit: int
    block: int
    share: int
    window: int = -1
    leased: int = 0
    spent: int = 0
    total: int = 0
    starts: float = 0.0
    ends: float = 0.0
    known: bool = False
    entitled: int = -1  # back from being alone, not yet settled: the most it may spend (else -1)
    held: int = 0  # what the store holds for this node beyond its claim, as last told
    kept: int = 0  # kept for the fast path's plugin once it asked for a table: a block, else 0

    def carry(self, old: Lease | None) -> Lease:
        """A lease made anew (a config reload) keeps the old one's books for the same key."""
        if old is not None and old.key == self.key:
            self.window, self.leased, self.spent, self.total = old.window, old.leased, old.spent, old.total
            self.known, self.entitled, self.held, self.kept = old.known, old.entitled, old.held, old.kept
        return self

    def roll(self, wall: float) -> None:
        if self.starts <= wall < self.ends:
            return
        window = int(wall // self.window_s)
        self.starts, self.ends = window * self.window_s, (window + 1) * self.window_s
        if window != self.window:
            self.window, self.leased, self.spent, self.total = window, 0, 0, 0
            self.entitled, self.held = -1, 0

    def alone_share(self) -> int:
        """What this node may spend in the window away from the store: its leases plus
        ``1/share`` of what was left at its last round."""
        return self.leased + max(0, self.limit - max(self.total, self.leased)) // self.share

    def remaining(self, wall: float, connected: bool) -> int:
        """What this node may still spend in the current window."""
        if not self.starts <= wall < self.ends:
            self.roll(wall)
        if self.entitled >= 0:
            return self.entitled - self.spent
        if connected:
            return self.leased - self.spent
        return self.alone_share() - self.spent

    def for_runner(self, wall: float, connected: bool) -> int:
        """What the runner's own decisions may still spend: the node's part less the plugin's."""
        return self.remaining(wall, connected) - self.kept

    def for_fast_path(self, wall: float, connected: bool) -> int:
        """What the plugin may spend until it next reports its spend (with its next fetch): at
        most a block, which the runner's decisions leave alone from now on."""
        self.kept = max(self.kept, self.block)  # never less than a table handed out may hold
        return min(self.block, self.remaining(wall, connected))

    def take(self, units: int, wall: float) -> bool:
        """Spend ``units``; whether the node should ask for more now (below half a block)."""
        if not self.starts <= wall < self.ends:
            self.roll(wall)
        self.spent += units
        if self.entitled >= 0:
            return False
        return self._low(self.leased) and self.total < self.limit

    def _low(self, claim: int) -> bool:
        """Whether less than half a block is left beyond what the plugin may spend."""
        return claim - self.spent - self.kept < self.block // 2 + 1

    def request(self, wall: float, release: bool = False, back: float | None = None) -> dict[str, Any] | None:
        """This lease's part of a round: a claim for what was spent beyond the leases, and a block
        when less than half a block is left; ``release`` hands back what is unused (at exit).
        ``back``: when this node found the store again, while not every node has told its claims
        since; a lease whose window was open then asks for nothing, spends its alone share and
        holds the rest of it in the store."""
        self.roll(wall)
        claim = max(self.leased, self.spent)
        if release:
            return self._asked(self.spent, 0, release=1)
        if back is not None and self.starts <= back:
            if self.entitled < 0:  # a lease never answered may have been made since: no share
                self.entitled = max(self.alone_share(), claim) if self.known else claim
            self.held = max(0, self.entitled - claim)
            return self._asked(claim, 0, self.held)
        if self.entitled >= 0:  # every node has told its claims: of the alone share, a block stays
            self.leased = claim = max(claim, min(self.entitled, self.spent + self.block))
            self.entitled = -1
        want = self.block if self._low(claim) else 0
        if want == 0 and claim == self.leased and self.held == 0:
            return None
        return self._asked(claim, want)

    def _asked(self, claim: int, want: int, hold: int = 0, release: int = 0) -> dict[str, Any]:
        return {
            "key": f"{self.key}:{self.window}",
            "limit": self.limit,
            "claim": claim,
            "want": want,
            "hold": hold,
            "release": release,
            "ttl_ms": self.window_s * 1000,
        }

    def keep_to_claim(self) -> None:
        """The store lost what this node told it (it restarted empty) while the node was not deciding
        alone: until settled, the node spends no more than it had been leased."""
        if self.entitled < 0:
            self.entitled = max(self.leased, self.spent)

    def granted(self, window: int, mine: int, total: int, before: int = 0, held: int = 0) -> None:
        """The store's answer: this node's leases in the window, all nodes' together (holds
        included), this node's claim as it stood before this round, and what it now holds. The
        first answer a lease gets counts that earlier claim as spent: a lease made anew (a reload,
        a tenant forgotten and seen again) never spends again what an earlier one of this node
        was granted."""
        if window == self.window:
            if not self.known:
                self.spent += before
                self.known = True
            self.leased, self.total, self.held = mine, total, held


@dataclass
class Comeback:
    """This node's way back to the store. Back from deciding alone, or finding a store that lost
    what the node told it (restarted empty: a new ``born``), the node is leased nothing more until
    ``share`` nodes have each told the store all their claims since it came back (``told``, counted
    by the store on its own clock): the others may have spent alone what the store has not heard
    of yet, and a block leased on top of that would be spent twice."""

    share: int
    reached: bool = False  # a round has been answered since start
    back: float | None = None  # the wall time this node came back, until settled
    since: int = 0  # the store's clock (ms) then
    born: int = 0  # the store's clock when it first answered with no state: which store this is

    def away(self, connected: bool) -> bool:
        """Whether a round sent now is this node's way back from deciding alone."""
        return self.reached and not connected

    def asked(self) -> dict[str, int]:
        return {"since": self.since if self.back is not None else 0, "born": self.born}

    def answered(self, wall: float, away: bool, now: int, told: int, born: int) -> bool:
        """A round's answer; whether it shows a store that lost what this node told it."""
        lost = self.born != 0 and born != self.born
        self.born, self.reached = born, True
        if away or lost:
            self.back, self.since = wall, now
        elif self.back is not None and told >= self.share:
            self.back = None
        return lost


class Limits:
    """The leases and slots of one target or tenant (only those the config limits)."""

    def __init__(self, hour_usd: float | None = None, day_usd: float | None = None) -> None:
        self.hour_usd, self.day_usd = hour_usd, day_usd
        self.hour: Lease | None = None
        self.day: Lease | None = None
        self.minute: Lease | None = None
        self.slots: Slots | None = None

    def leases(self) -> list[Lease]:
        return [lease for lease in (self.hour, self.day, self.minute) if lease is not None]

    def spent_usd(self, wall: float, connected: bool, fast_path: bool) -> tuple[float, float]:
        """What the policy compares with the hourly and daily budgets: each less what the runner's
        own decisions may spend, or with ``fast_path`` what the plugin may until its next fetch."""
        shown = []
        for lease, usd in ((self.hour, self.hour_usd), (self.day, self.day_usd)):
            if lease is None:
                shown.append(0.0)
                continue
            left = lease.for_fast_path(wall, connected) if fast_path else lease.for_runner(wall, connected)
            shown.append((usd or 0.0) - left / NANO_USD)
        return shown[0], shown[1]

    def take_spend(self, units: int, wall: float) -> bool:
        """Spend ``units`` of the hourly and daily leases; whether either wants more now."""
        more = False
        for lease in (self.hour, self.day):
            if lease is not None:
                more |= lease.take(units, wall)
        return more


@dataclass
class Asked:
    """A round's lines for leases and slots, and the lease or slots each line is for."""

    leases: list[dict[str, Any]] = field(default_factory=list)
    lease_refs: list[Lease] = field(default_factory=list)
    slots: list[dict[str, Any]] = field(default_factory=list)
    slot_refs: list[Slots] = field(default_factory=list)

    def add(
        self, limits: Limits, busy: int, wall: float, release: bool, back: float | None, always: bool = False
    ) -> None:
        """What ``limits`` has to tell or ask (``busy``: its in-flight count; ``back``: see
        ``Lease.request``)."""
        for lease in limits.leases():
            asked = lease.request(wall, release, back)
            if asked is not None:
                self.leases.append(asked)
                self.lease_refs.append(lease)
        slots = limits.slots
        if slots is not None:
            line = (
                {"key": slots.key, "cap": slots.cap, "want": 0, "busy": 0}
                if release
                else slots.request(busy, always, back is not None)
            )
            if line is not None:
                self.slots.append(line)
                self.slot_refs.append(slots)


@dataclass
class Slots:
    key: str
    cap: int
    block: int
    share: int
    held: int = 0
    others_busy: int = 0
    asked: int = -1
    least: int = -1  # the least want sent since the last answer (-1: none)
    kept: int = 0  # kept for the fast path's plugin once it asked for a table: a block, else 0

    def carry(self, old: Slots | None) -> Slots:
        """Slots made anew (a config reload) keep what the old ones held, last asked for (a round
        out may be giving slots back), and kept for the plugin."""
        if old is not None:
            self.held, self.others_busy, self.kept = old.held, old.others_busy, old.kept
            self.asked, self.least = old.asked, old.least
        return self

    def allowed(self, together: bool, counted: bool = False) -> int:
        """Slots this node may fill: those it holds while it decides with the store (connected,
        and settled if it came back), else its share of the cap, and no more than it holds while
        the store may still count that (``counted``: the others fill the rest of the cap). What
        it holds is no more than it asked for since the last answer: the store sets what the node
        holds to each want at most (a round answered late or not at all may still have run),
        maybe after the node filled more while the round was out, and the others may then fill
        what it gave back."""
        held = self.held if self.least < 0 else min(self.held, self.least)
        if together:
            return held
        share = max(1, self.cap // self.share)
        return min(held, share) if counted else share

    def for_runner(self, together: bool, counted: bool = False) -> int:
        """What the runner's own decisions may fill: the node's slots less the plugin's block."""
        return self.allowed(together, counted) - self.kept

    def for_fast_path(self, together: bool, counted: bool = False) -> int:
        """What the plugin may fill, from now on kept out of the runner's part: one block."""
        self.kept = max(self.kept, self.block)  # never less than a table handed out may hold
        return min(self.block, self.allowed(together, counted))

    def request(self, in_flight: int, always: bool = False, settling: bool = False) -> dict[str, Any] | None:
        """Ask for in-flight plus a block (the cap at most); nothing when that is already asked,
        unless ``always`` (a target's slots come in every round, with the others' busy counts).
        ``settling`` (back, not yet settled): ask to hold the share of the cap it fills meanwhile."""
        busy = in_flight + self.kept
        want = min(self.cap, max(busy, self.allowed(False)) if settling else busy + self.block)
        if want == self.held and want == self.asked and not always:
            return None
        self.asked = want
        self.least = want if self.least < 0 else min(self.least, want)
        return {"key": self.key, "cap": self.cap, "want": want, "busy": in_flight}

    def granted(self, held: int, others_busy: int) -> None:
        self.held, self.others_busy, self.least = held, others_busy, -1


@dataclass
class SharedBreaker:
    gen: int = 0
    until_ms: int = 0
    cooldown_ms: int = 0
    probes: int = 0
    probes_out: int = 0
    op: str | None = None
    op_gen: int = 0

    def state(self, wall: float) -> BreakerState:
        if self.op == "open":
            return BreakerState.OPEN
        if self.until_ms == 0:
            return BreakerState.CLOSED
        return BreakerState.OPEN if wall * 1000 < self.until_ms else BreakerState.HALF_OPEN

    def dispatched(self, wall: float) -> None:
        if self.until_ms and self.state(wall) is BreakerState.HALF_OPEN and self.probes > 0:
            self.probes -= 1
            self.probes_out += 1

    def outcome(self, ok: bool) -> bool:
        """An answer while a probe is out resolves it (answers are anonymous); whether it did."""
        if self.probes_out == 0:
            return False
        self.probes_out -= 1
        self.say("close" if ok else "open")
        return True

    def say(self, op: str) -> None:
        """Open or close it for every node, as of the generation this node knows."""
        if self.op != "open":
            self.op, self.op_gen = op, self.gen

    def request(
        self, target: str, wall: float, base_s: float, max_s: float, probes: int, probe_ttl_s: float
    ) -> dict[str, Any]:
        half_open = self.until_ms > 0 and wall * 1000 >= self.until_ms
        want = max(0, probes - self.probes - self.probes_out) if half_open else 0
        return {
            "target": target,
            "op": self.op or "",
            "gen": self.op_gen if self.op else self.gen,
            "now": int(wall * 1000),
            "base": int(base_s * 1000),
            "max": int(max_s * 1000),
            "probes": want,
            "max_probes": probes,
            "probe_ttl_ms": int(probe_ttl_s * 1000),
        }

    def granted(self, sent_op: str | None, gen: int, until_ms: int, cooldown_ms: int, probes: int) -> bool:
        """The store's answer; whether the breaker is now open for every node (the local one, a
        mere detector while the store answers, may start afresh)."""
        if gen != self.gen:
            self.probes = self.probes_out = 0
        self.gen, self.until_ms, self.cooldown_ms = gen, until_ms, cooldown_ms
        self.probes += probes
        if sent_op is not None and self.op == sent_op:
            self.op = None
        return sent_op == "open" and until_ms > 0
