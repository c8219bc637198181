"""The on-prem cluster's members as the scrapes find them: who answers, who is failing, who is gone.

Kubernetes replaces pods in every rolling update, drain and eviction, so one member that stops
answering is the normal case, not a reason to stop reading the others. Each round counts every
member that answered; one that fails is kept for ``drop_after_s`` (a blip is not a departure), its
last sample still counted, then dropped from the load and the capacity until it answers again. A
change of a member's state is logged once, not every round.

Triton's counters are cumulative per process, so the round's work is summed from each member's
own deltas: a member that joins (or restarts, its counters lower than before) gives a baseline
first, never a negative or a whole history's worth of requests at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

log = logging.getLogger("spillway.signals")


@dataclass(frozen=True)
class Counters:
    """One model's cumulative counters (summed over versions) and its pending sample."""

    success: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0
    pending: float = 0.0

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.success + other.success,
            self.queue_us + other.queue_us,
            self.compute_us + other.compute_us,
            self.pending + other.pending,
        )


class MemberState(StrEnum):
    """The label of ``spillway_local_members``."""

    UP = "up"
    FAILING = "failing"
    DOWN = "down"


@dataclass
class _Member:
    state: MemberState = MemberState.DOWN
    counters: dict[str, Counters] = field(default_factory=dict)
    failing_since: float = 0.0
    fresh: bool = False


@dataclass(frozen=True)
class RoundSums:
    """What a round adds up to over the members that count: per model, the work done since the
    last round (``delta``, from members seen in both) and the requests pending now; how many members
    count (up, or failing within their grace); whether any answered."""

    delta: dict[str, Counters]
    pending: dict[str, float]
    live: int
    answered: int


class Members:
    """The members' books, keyed by their metrics URL. ``urls`` may change each round (discovery);
    a member no longer named is forgotten at once."""

    def __init__(self, drop_after_s: float) -> None:
        self.drop_after_s = drop_after_s
        self._members: dict[str, _Member] = {}

    def round(self, answers: Mapping[str, dict[str, Counters] | BaseException], now: float) -> RoundSums:
        """One round's answers (a member's counters, or why its scrape failed), as sums."""
        for gone in set(self._members) - set(answers):
            del self._members[gone]
        delta: dict[str, Counters] = {}
        pending: dict[str, float] = {}
        live = answered = 0
        for url, answer in answers.items():
            member = self._members.setdefault(url, _Member())
            if isinstance(answer, BaseException):
                self._failed(url, member, answer, now)
            else:
                answered += 1
                for model, change in _changes(member.counters, answer) if member.fresh else ():
                    delta[model] = delta.get(model, Counters()) + change
                member.counters, member.fresh = answer, True
                self._set(url, member, MemberState.UP, "answers again")
            if member.state is MemberState.DOWN:
                continue
            live += 1
            for model, counters in member.counters.items():
                pending[model] = pending.get(model, 0.0) + counters.pending
        return RoundSums(delta, pending, live, answered)

    def _failed(self, url: str, member: _Member, why: BaseException, now: float) -> None:
        if member.state is MemberState.UP:
            member.failing_since = now
            self._set(
                url, member, MemberState.FAILING, f"failed ({why}); dropped after {self.drop_after_s:g} s"
            )
        elif member.state is MemberState.FAILING and now - member.failing_since >= self.drop_after_s:
            member.counters, member.fresh = {}, False
            self._set(
                url, member, MemberState.DOWN, f"dropped: not answering for {self.drop_after_s:g} s ({why})"
            )
        elif member.state is MemberState.DOWN and not member.failing_since:
            member.failing_since = now
            log.warning("on-prem member %s does not answer (%s)", url, why)

    @staticmethod
    def _set(url: str, member: _Member, state: MemberState, why: str) -> None:
        if member.state is state:
            return
        if state is not MemberState.UP or member.failing_since:
            log.warning("on-prem member %s %s", url, why)
        member.state = state
        if state is MemberState.UP:
            member.failing_since = 0.0

    @property
    def known(self) -> int:
        return len(self._members)

    def counts(self) -> dict[MemberState, int]:
        counted = dict.fromkeys(MemberState, 0)
        for member in self._members.values():
            counted[member.state] += 1
        return counted


def _changes(before: dict[str, Counters], now: dict[str, Counters]) -> Iterable[tuple[str, Counters]]:
    """Each model's work between two samples of one member; none where its counters went back
    (the process restarted: ``now`` is a new baseline)."""
    for model, counters in now.items():
        last = before.get(model)
        if last is None or counters.success < last.success:
            continue
        yield (
            model,
            Counters(
                counters.success - last.success,
                counters.queue_us - last.queue_us,
                counters.compute_us - last.compute_us,
            ),
        )
