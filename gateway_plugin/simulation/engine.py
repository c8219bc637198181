"""The discrete-event loop: arrivals from the trace, the cluster and the clouds answering, the
runner's scrapes, outcome reports and warm-up rounds, one router deciding, everything measured.

Time is simulated seconds from the trace's start; the warm-up pinger has been running before it,
so the instances it keeps are warm at the start. Each request's random draws (service times)
come from one stream seeded by ``seed`` and are made once, so every policy meets the same
requests; each cloud target's cold starts and failures come from a stream of their own.
"""

from __future__ import annotations

import datetime
import heapq
import math
import random
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from zoneinfo import ZoneInfo

from gateway_plugin.config import SpillwayConfig, WarmTarget
from gateway_plugin.config.warmup import wanted
from gateway_plugin.policy.model import LOCAL, SHED
from gateway_plugin.policy.snapshot import RequestFeatures
from gateway_plugin.signals.members import Counters
from gateway_plugin.simulation.billing import Bill
from gateway_plugin.simulation.cloud import CloudTarget, Served, lognormal
from gateway_plugin.simulation.cluster import Batch, Cluster, Job
from gateway_plugin.simulation.results import CLOUD_KIND, FAILED_KIND, LOCAL_KIND, SHED_KIND, Measures
from gateway_plugin.simulation.runner_policy import EPOCH, per_member
from gateway_plugin.simulation.tokens import TRACES
from gateway_plugin.simulation.trace import Shaping, Trace, arrivals
from gateway_plugin.simulation.world import Router, World

LOCAL_DONE, CLOUD_DONE, SCRAPE, SCRAPED, FLUSH, WARMUP, PING_DONE, WARM_REPORT, MEMBERS = range(9)
# The runner reads the warm-up report file every 2 s: on average a report is 1 s old when read.
WARM_REPORT_DELAY_S = 1.0
Progress = Callable[[float], None]


def features(config: SpillwayConfig) -> dict[bool, RequestFeatures]:
    """The request the trace stands for, public and confidential (content-type as Triton's JSON):
    ``infer``, or ``generate_stream`` where the simulation's requests are generations."""
    model = config.simulation.model
    header = config.residency.header.lower()
    verb = "infer" if config.simulation.generation is None else "generate_stream"
    out = {}
    for confidential in (False, True):
        headers = {"content-type": "application/json", header: "confidential" if confidential else "public"}
        out[confidential] = RequestFeatures(f"/v2/models/{model}/{verb}", headers, {}, model, 0)
    return out


def jobs(config: SpillwayConfig, trace: Trace, shaping: Shaping, seed: int) -> Iterator[Job]:
    """The trace's requests with their draws: a service time, or a generation's token lengths and
    the compute they take, times the cluster's noise (a lognormal of mean 1)."""
    sim = config.simulation
    rng = random.Random(seed)
    generation = sim.generation
    mean_ms = sim.cluster.service_ms if generation is None else 1.0
    mu, sigma = lognormal(mean_ms, sim.cluster.service_cv)
    lengths = TRACES[generation.tokens] if generation is not None else None
    gauss, exp = rng.gauss, math.exp
    for a in arrivals(trace, shaping, rng):
        local = exp(mu + sigma * gauss(0.0, 1.0))
        job = Job(a.at_s, a.body_bytes, a.confidential, local, gauss(0.0, 1.0))
        job.tenant = a.tenant
        job.sheddable = a.sheddable
        if generation is not None and lengths is not None:
            prompt, tokens = lengths.draw(rng)
            prefill = prompt * generation.prefill_ms_per_1k_tokens / 1000
            decode = (tokens - 1) * generation.ms_per_output_token
            job.tokens, job.prompt, job.base_ms = tokens, prompt, prefill + decode
            job.decode_share = decode / job.base_ms if job.base_ms > 0 else 0.0
            job.local_ms = local * job.base_ms
        yield job


class Engine:
    def __init__(self, config: SpillwayConfig, router: Router, seed: int) -> None:
        sim = config.simulation
        self.config, self.router, self.seed = config, router, seed
        self.bill = Bill({t.name: t.cost for t in config.targets})
        self.clouds = {
            t.name: CloudTarget(
                t, sim.target(t.name), self.bill, random.Random(seed ^ zlib.crc32(t.name.encode()))
            )
            for t in config.targets
        }
        self.per_member = per_member(config)
        members = sim.members_at_start(len(config.local.endpoints))
        self.cluster = Cluster(self._servers(members), sim.cluster)
        target_ms = config.local.model_latency_targets_ms.get(sim.model, config.local.latency_target_ms)
        if sim.generation is not None:
            target_ms = config.local.model_ttft_targets_ms.get(sim.model, target_ms)
        self.world = World(self.cluster, self.clouds, target_ms, features=features(config))
        self.measures = Measures(target_ms, local_cost=config.local.cost)
        self.local_net_s = sim.cluster.network_ms / 1000
        self.lag_s = sim.outcome_lag_s if sim.outcome_lag_s is not None else float(config.outcomes.batch_s)
        self.invoke = {t.name for t in config.targets if t.mode == "invoke"}
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.outstanding = 0
        self.pending: list[tuple[int, Any]] = []
        self.busy_at_scrape = 0.0
        self.provisioned_billed_at = 0.0
        self.targets = {t.name: t for t in config.targets}
        # When each target sized by its overflow took a request, over its sample (as the pinger
        # reads the gateway's decisions from its metrics).
        self.sent: dict[str, deque[float]] = {
            name: deque() for name, spec in config.warmup.targets.items() if spec.adaptive is not None
        }
        # The trace starts at midnight where the warm-up reads its windows.
        self.zone = ZoneInfo(config.warmup.timezone)
        midnight = datetime.datetime.fromtimestamp(EPOCH, datetime.UTC).replace(tzinfo=self.zone)
        self.midnight_s = midnight.timestamp()

    def _servers(self, members: int) -> int:
        return max(1, round(members * self.per_member))

    def push(self, at: float, kind: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, payload))

    def run(self, stream: Iterator[Job], progress: Progress | None = None) -> Measures:
        # The runner was scraping the cluster before the trace began (its counters hold the
        # requests served before, so the first scrape in the trace gives their service time).
        self.router.scraped(Counters(), -self.config.local.scrape_period_s)
        self.push(0.0, SCRAPE, None)
        for change in self.config.simulation.membership:
            self.push(change.at_s, MEMBERS, change.members)
        warmup = self.config.warmup
        for name, spec in warmup.targets.items():
            warm = self.clouds[name].prewarm(self._sized(name, spec, 0.0), 0.0, pinned=spec.provisioned)
            self.router.warm_report(name, warm, 0.0)
        if warmup.targets:
            self.push(warmup.interval_s, WARMUP, None)
        events, handle, now = self.events, self._handle, 0.0
        for count, job in enumerate(stream):
            now = job.at
            while events[0][0] <= now:
                at, _, kind, payload = heapq.heappop(events)
                handle(at, kind, payload)
            self._arrive(job, now)
            if progress is not None and not count & 0x3FFF:
                progress(now)
        while self.outstanding or self.pending:
            at, _, kind, payload = heapq.heappop(events)
            now = at
            handle(at, kind, payload)
        for cloud in self.clouds.values():
            cloud.close(now)
        self._provisioned_until(now)
        self.measures.seconds = now
        self.measures.cost_by_target = dict(self.bill.by_target)
        self.measures.cost_by_second = self.bill.by_second
        return self.measures

    def _arrive(self, job: Job, now: float) -> None:
        target = self.router.route(job, now, self.world)
        job.target = target
        measures = self.measures
        if target == LOCAL:
            self.outstanding += 1
            started = self.cluster.arrive(job, now)
            if started is not None:
                self.push(started[0], LOCAL_DONE, started[1])
        elif target == SHED:
            measures.record(job.at, 0.0, SHED_KIND)
        else:
            if job.confidential:
                measures.residency_breaches += 1
            self.outstanding += 1
            sent = self.sent.get(target)
            if sent is not None:
                sent.append(now)
            cloud = self.clouds[target]
            service_ms = cloud.service_ms(job.cloud_z, job.base_ms or None)
            served = cloud.dispatch(now, service_ms, job.tokens, job.prompt if job.tokens else None)
            self.push(served.done_at, CLOUD_DONE, (job, served, service_ms))
        if not job.confidential:
            measures.decided(target not in (LOCAL, SHED))

    def _handle(self, now: float, kind: int, payload: Any) -> None:
        if kind == LOCAL_DONE:
            self._local_done(payload, now)
        elif kind == CLOUD_DONE:
            self._cloud_done(payload[0], payload[1], payload[2], now)
        elif kind == SCRAPE:
            self._scrape(now)
        elif kind == SCRAPED:
            self.world.utilisation = payload[1]
            self.router.scraped(payload[0], now, payload[1], payload[2])
        elif kind == FLUSH:
            self._flush(now)
        elif kind == WARMUP:
            self._warmup(now)
        elif kind == PING_DONE:
            self.clouds[payload[0]].release(payload[1].instance, now)
        elif kind == WARM_REPORT:
            self.router.warm_report(payload[0], payload[1], now)
        elif kind == MEMBERS:
            for end, batch in self.cluster.resize(self._servers(payload), now):
                self.push(end, LOCAL_DONE, batch)
            self.router.members_changed(payload, now)

    def _local_done(self, batch: Batch, now: float) -> None:
        """A batch is done; each answer's time is to its first byte (a generation's first token),
        which is also what the route reports of the cluster."""
        net, record = self.local_net_s, self.measures.record
        listens, returned = self.router.listens, self.router.returned
        for job in batch:
            compute_ms = (now - job.started) * 1000
            ms = job.first_byte_ms((now - job.at + net) * 1000, compute_ms)
            record(job.at, ms, LOCAL_KIND)
            if listens:
                returned(job, now)
                self._report((LOCAL_DONE, (ms, job.tenant)), now)
        self.outstanding -= len(batch)
        started = self.cluster.finish(batch, now)
        if started is not None:
            self.push(started[0], LOCAL_DONE, started[1])

    def _cloud_done(self, job: Job, served: Served, service_ms: float, now: float) -> None:
        """A function's answer: its SLO from the first byte (a generation's first token; a function
        the runner invokes answers whole), its outcome as the route reports it, with the whole
        answer's time and its tokens."""
        self.outstanding -= 1
        ms = (now - job.at) * 1000
        first_byte = ms if job.target in self.invoke else job.first_byte_ms(ms, service_ms)
        self.measures.record(job.at, first_byte, CLOUD_KIND if served.ok else FAILED_KIND)
        instance = served.instance
        if served.cold:
            self.measures.cold_hits += 1
        if instance is not None:
            self.clouds[job.target].release(instance, now)
        if self.router.listens:
            self.router.returned(job, now)
            answer = (
                job.target,
                instance.id if instance else "",
                served.cold,
                served.ok,
                ms / 1000,
                job.tenant,
                job.tokens,
                job.prompt,
            )
            if job.target in self.invoke:
                self.router.answered_cloud(
                    *answer[:5], now=now, tenant=job.tenant, tokens=job.tokens, prompt=job.prompt
                )
            else:
                self._report((CLOUD_DONE, answer), now)

    def _report(self, outcome: tuple[int, Any], now: float) -> None:
        """The gateway's logger batches outcomes: the first of a batch starts its timer."""
        if not self.pending:
            self.push(now + self.lag_s, FLUSH, None)
        self.pending.append(outcome)

    def _flush(self, now: float) -> None:
        router, pending = self.router, self.pending
        self.pending = []
        for kind, answer in pending:
            if kind == LOCAL_DONE:
                router.answered_local(answer[0], now, answer[1])
            else:
                target, instance, cold, ok, seconds, tenant, tokens, prompt = answer
                router.answered_cloud(target, instance, cold, ok, seconds, now, tenant, tokens, prompt)

    def _scrape(self, now: float) -> None:
        period = self.config.local.scrape_period_s
        busy = self.cluster.busy_s(now)
        utilisation = (busy - self.busy_at_scrape) / (period * self.cluster.servers)
        self.busy_at_scrape = busy
        lag = self.config.simulation.cluster.scrape_lag_ms / 1000
        occupied = (self.cluster.servers - self.cluster.free) / self.cluster.servers
        self.push(now + lag, SCRAPED, (self.cluster.counters(), utilisation, occupied))
        self.push(now + period, SCRAPE, None)

    def _provisioned_until(self, now: float) -> None:
        """What the provisioned instances cost up to ``now``, as the warm-up's: Lambda's price per
        GB-second provisioned, used or not; FC's idle time (its cloud bills it as it happens)."""
        seconds = now - self.provisioned_billed_at
        self.provisioned_billed_at = now
        for name, spec in self.config.warmup.targets.items():
            if not spec.provisioned:
                continue
            cost = self.targets[name].cost
            held = len(self.clouds[name].pinned)
            usd = held * cost.memory_gb * cost.usd_per_provisioned_gb_second * seconds
            self.bill.idle(name, usd, now)
            self.measures.warmup_cost_usd += usd
            self.measures.warmup_cost_usd += self.clouds[name].pinned_idle_usd
            self.clouds[name].pinned_idle_usd = 0.0

    def _warmup(self, now: float) -> None:
        """A warm-up round: each target's pings, each holding an instance for the dwell; a target
        kept by provisioned concurrency is reported warm as it is, and billed for it."""
        warmup = self.config.warmup
        self._provisioned_until(now)
        for name, spec in warmup.targets.items():
            cloud = self.clouds[name]
            count = self._sized(name, spec, now)
            if spec.provisioned:
                ready_by = cloud.provision(count, now)
                self.push(ready_by + WARM_REPORT_DELAY_S, WARM_REPORT, (name, list(cloud.pinned)))
                continue
            before = self.bill.by_target[name]
            # A ping carries no prompt: priced as the warm-up prices it (costs.warm_ping_cost_usd).
            pings = [cloud.dispatch(now, float(spec.dwell_ms), prompt=0) for _ in range(count)]
            self.measures.warmup_cost_usd += self.bill.by_target[name] - before
            reached = [p.instance.id for p in pings if p.instance is not None]
            for ping in pings:
                if ping.instance is not None:
                    self.push(ping.done_at, PING_DONE, (name, ping))
            last = max((p.done_at for p in pings), default=now)
            self.push(last + WARM_REPORT_DELAY_S, WARM_REPORT, (name, reached))
        self.push(now + warmup.interval_s, WARMUP, None)

    def _sized(self, name: str, spec: WarmTarget, now: float) -> int:
        """What a warm-up round at ``now`` keeps warm, as the pinger sizes it: the window of the
        simulated day (its wall clock in ``warmup.timezone``), or Little's law on the requests the
        target took over the sample before the round (the pinger samples, then pings)."""
        clock = datetime.datetime.fromtimestamp(self.midnight_s + now, self.zone).time()
        sent, rate = self.sent.get(name), None
        if sent is not None and spec.adaptive is not None and now > 0:
            horizon = now - spec.adaptive.sample_s
            while sent and sent[0] < horizon:
                sent.popleft()
            rate = len(sent) / min(now, spec.adaptive.sample_s)
        return wanted(spec, clock, rate, self.targets[name].cost.expected_duration_ms / 1000)


def replay(
    config: SpillwayConfig,
    router: Router,
    arrivals: Sequence[Job],
    seed: int,
    progress: Progress | None = None,
) -> Measures:
    """One policy over requests drawn once (``jobs``), each run on a fresh copy of them."""
    return Engine(config, router, seed).run((job.copy() for job in arrivals), progress)


def simulate(
    config: SpillwayConfig,
    router: Router,
    trace: Trace,
    shaping: Shaping,
    seed: int,
    progress: Progress | None = None,
) -> Measures:
    """One policy over one trace."""
    return Engine(config, router, seed).run(jobs(config, trace, shaping, seed), progress)
