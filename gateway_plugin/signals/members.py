"""The on-prem cluster's members as the scrapes find them: who answers, who is failing, who is gone.

Kubernetes replaces pods in every rolling update, drain and eviction, so one member that stops
answering is the normal case, not a reason to stop reading the others. Each round counts every
member that answered; one that fails is kept for ``drop_after_s`` (a blip is not a departure), its
last sample still counted, then dropped from the load and the capacity until it answers again. A
change of a member's state is logged once, not every round.

A member can answer its metrics and still fail every inference (a wedged pod: a hung GPU, a model
that failed to load, a broken HTTP frontend). The gateway's own answers from it say so: APISIX
names the node it sent each request to (``$upstream_addr``), and a member whose last
``failures_to_wedge`` answers all failed stops counting as capacity until it answers a request
again or its own counters show it serving. While every member counting is wedged, they all count
(the cluster's breaker, ``health.local_health``, is then the one to act), so answers a client
can make fail cost at most the members that failed them, never the whole cluster.

Triton's counters are cumulative per process, so the round's work is summed from each member's
own deltas: a member that joins (or restarts, its counters lower than before) gives a baseline
first, never a negative or a whole history's worth of requests at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

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
    # Its metrics answer but its inference answers fail.
    WEDGED = "wedged"


@dataclass
class _Member:
    url: str
    state: MemberState = MemberState.DOWN
    counters: dict[str, Counters] = field(default_factory=dict)
    failing_since: float = 0.0
    fresh: bool = False
    failed_in_row: int = 0
    wedged: bool = False
    # Rounds after it was found wedged whose counters may still hold requests it served before.
    settling: int = 0
    # Instances per model from its own model configuration (``signals.model_config``), as read.
    instances: dict[str, float] = field(default_factory=dict)


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
    a member no longer named is forgotten at once.

    A request's answer names the member by its inference address (``host:port``, ``addressed``):
    where the config says it (the listed endpoints), or the metrics URL's host at the inference
    port (DNS discovery's A/AAAA records); otherwise the host alone names the member, where only
    one member has it."""

    def __init__(self, drop_after_s: float, failures_to_wedge: int = 3) -> None:
        self.drop_after_s = drop_after_s
        self.failures_to_wedge = failures_to_wedge
        self._inference: Mapping[str, str] = {}
        self._inference_port: int | None = None
        self._members: dict[str, _Member] = {}
        self._by_address: dict[str, _Member] = {}
        self._by_host: dict[str, _Member | None] = {}
        self._addresses: dict[str, str] = {}
        self._serving: list[_Member] = []

    def round(self, answers: Mapping[str, dict[str, Counters] | BaseException], now: float) -> RoundSums:
        """One round's answers (a member's counters, or why its scrape failed), as sums."""
        if self._members.keys() != answers.keys():
            for gone in set(self._members) - set(answers):
                del self._members[gone]
            for url in answers:
                self._members.setdefault(url, _Member(url))
            self._index()
        delta: dict[str, Counters] = {}
        answered = 0
        for url, answer in answers.items():
            member = self._members[url]
            if isinstance(answer, BaseException):
                self._failed(url, member, answer, now)
                continue
            answered += 1
            served = False
            for model, change in _changes(member.counters, answer) if member.fresh else ():
                delta[model] = delta.get(model, Counters()) + change
                served = served or change.success > 0
            if _restarted(member.counters, answer):
                member.instances = {}  # a new process: its models may be configured anew
            member.counters, member.fresh = answer, True
            self._set(url, member, MemberState.UP, "answers again")
            if member.settling:
                member.settling -= 1
            elif served and member.wedged:
                self._unwedge(member, "serves inference again (its counters moved)")
        counted = [m for m in self._members.values() if m.state is not MemberState.DOWN]
        serving = self._serving = [m for m in counted if not m.wedged] or counted
        pending: dict[str, float] = {}
        for member in serving:
            for model, counters in member.counters.items():
                pending[model] = pending.get(model, 0.0) + counters.pending
        return RoundSums(delta, pending, len(serving), answered)

    def answered(self, address: str, ok: int, failed: int, trailing: int) -> None:
        """Requests the member at ``address`` (APISIX's ``host:port``) answered, ok and failed, of
        which ``trailing`` failed after the last ok one: a run of failures that long or longer
        (across calls) takes it for wedged, any ok answer brings it back."""
        member = self._by_address.get(address) or self._by_host.get(_host(address.rpartition(":")[0]))
        if member is None:
            return
        if ok:
            if member.wedged:
                self._unwedge(member, "answers requests again")
            member.failed_in_row = min(trailing, failed)
        else:
            member.failed_in_row += failed
        if not member.wedged and member.failed_in_row >= self.failures_to_wedge:
            # The round being read may predate these answers, and the next one's delta may hold a
            # request it served just before: only the counters read after that say it serves.
            member.wedged, member.settling = True, 2
            log.warning(
                "on-prem member %s answers its metrics but failed its last %d requests: not counted as "
                "capacity until it serves again",
                member.url,
                member.failed_in_row,
            )

    def addressed(self, inference: Mapping[str, str], port: int | None) -> None:
        """How answers name the members: ``inference`` (metrics URL to ``host:port``), else the
        metrics URL's host at ``port``, else its host alone."""
        self._inference, self._inference_port = dict(inference), port
        self._index()

    @staticmethod
    def _unwedge(member: _Member, why: str) -> None:
        member.wedged, member.failed_in_row = False, 0
        log.warning("on-prem member %s %s", member.url, why)

    def instances(self, model: str) -> float:
        """Instances of ``model`` (every model's with ``""``) over the members counting, each as its
        own configuration says; one per model on its page where that was not read yet."""
        total = 0.0
        for member in self._serving:
            models = member.counters if model == "" else (model,) if model in member.counters else ()
            total += sum(member.instances.get(m, 1.0) for m in models)
        return total

    def unread(self) -> list[tuple[str, str, list[str]]]:
        """Members answering with models whose configuration is not read: (metrics URL, inference
        base URL, those models); only members whose inference address is known."""
        wanted = []
        for url, member in self._members.items():
            base = self._addresses.get(url)
            models = [m for m in member.counters if m not in member.instances]
            if base is not None and models and member.state is MemberState.UP:
                wanted.append((url, f"http://{base}", models))
        return wanted

    def read(self, found: Mapping[str, Mapping[str, float]]) -> None:
        """Instances per model read from members' configurations (``unread``'s answers)."""
        for url, counts in found.items():
            member = self._members.get(url)
            if member is not None:
                if member.instances != {**member.instances, **counts}:
                    log.info("on-prem member %s runs %s", url, dict(counts))
                member.instances.update(counts)

    def _index(self) -> None:
        self._by_address, self._by_host, self._addresses = {}, {}, {}
        for url, member in self._members.items():
            host = _host(urlsplit(url).hostname or "")
            address = self._inference.get(url)
            if address is None and self._inference_port is not None:
                address = f"{_bracketed(host)}:{self._inference_port}"
            if address is not None:
                self._by_address[address] = member
                self._addresses[url] = address
            self._by_host[host] = None if host in self._by_host else member

    def _failed(self, url: str, member: _Member, why: BaseException, now: float) -> None:
        if member.state is MemberState.UP:
            member.failing_since = now
            self._set(
                url, member, MemberState.FAILING, f"failed ({why}); dropped after {self.drop_after_s:g} s"
            )
        elif member.state is MemberState.FAILING and now - member.failing_since >= self.drop_after_s:
            member.counters, member.fresh = {}, False
            member.wedged, member.failed_in_row = False, 0
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
            wedged = member.wedged and member.state is MemberState.UP
            counted[MemberState.WEDGED if wedged else member.state] += 1
        return counted


def _host(host: str) -> str:
    return host.strip("[]").lower()


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _restarted(before: dict[str, Counters], now: dict[str, Counters]) -> bool:
    return any(model in before and c.success < before[model].success for model, c in now.items())


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
