"""The on-prem cluster as Triton runs it: a FIFO queue in front of ``parallelism`` model instances,
the dynamic batcher taking up to ``max_batch`` queued requests at once, and the counters its
Prometheus endpoint exposes (successes, cumulative queue and compute time, pending requests)."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque

from gateway_plugin.signals.members import Counters
from gateway_plugin.simulation.settings import SimulatedCluster

HISTORY = 100


class Job:
    """One simulated request; its random draws are made once, so every policy sees the same ones."""

    __slots__ = (
        "arrived",
        "at",
        "base_ms",
        "body_bytes",
        "cloud_z",
        "confidential",
        "decode_share",
        "local_ms",
        "prompt",
        "sent_cold",
        "sheddable",
        "started",
        "target",
        "tenant",
        "tokens",
    )

    def __init__(
        self, at: float, body_bytes: int, confidential: bool, local_ms: float, cloud_z: float
    ) -> None:
        self.at = at
        self.body_bytes = body_bytes
        self.confidential = confidential
        self.local_ms = local_ms
        self.cloud_z = cloud_z
        self.target = ""
        self.sent_cold = False
        self.tenant: str | None = None
        self.sheddable = False
        self.arrived = at
        self.started = at
        # A generation: its output tokens, its prompt's (as the gateway counts them from its body),
        # its compute before noise, and the share of its compute after its first token.
        self.tokens = 0
        self.prompt = 0
        self.base_ms = 0.0
        self.decode_share = 0.0

    def copy(self) -> Job:
        """The same request, not yet routed (a run writes where it went and when it started)."""
        job = Job(self.at, self.body_bytes, self.confidential, self.local_ms, self.cloud_z)
        job.tenant = self.tenant
        job.sheddable = self.sheddable
        job.tokens, job.base_ms, job.decode_share = self.tokens, self.base_ms, self.decode_share
        job.prompt = self.prompt
        return job

    def first_byte_ms(self, done_ms: float, compute_ms: float) -> float:
        """When its first byte came, of an answer whose last came after ``done_ms`` and that
        computed for ``compute_ms``: a generation's first token, before it decoded the rest."""
        return done_ms - compute_ms * self.decode_share


Batch = list[Job]


class Cluster:
    def __init__(self, servers: int, settings: SimulatedCluster) -> None:
        self.servers = servers
        self.free = servers
        self.max_batch = settings.max_batch
        self.growth = settings.batch_growth
        self.queue: deque[Job] = deque()
        self.running: list[float] = []
        # Triton has served requests before the trace begins: its cumulative counters say so, and a
        # runner that has been scraping it knows its service time from the first scrape on.
        self.success = HISTORY
        self.queue_us = 0.0
        self.compute_us = HISTORY * settings.service_ms * 1000
        self.committed_s = 0.0

    def resize(self, servers: int, now: float) -> list[tuple[float, Batch]]:
        """The cluster now runs ``servers`` model instances (members came or went): the batches
        that start at once on the new ones. Instances that leave finish what they run (a pod's
        graceful termination) and take no more."""
        self.free += servers - self.servers
        self.servers = servers
        started = []
        while self.free > 0 and self.queue:
            started.append(self._start(now))
        return started

    @property
    def in_flight(self) -> int:
        return len(self.queue) + self.servers - self.free

    def arrive(self, job: Job, now: float) -> tuple[float, Batch] | None:
        """Queue a request; the batch it starts, if a model instance was free, with its end."""
        job.arrived = now
        self.queue.append(job)
        return self._start(now) if self.free else None

    def finish(self, batch: Batch, now: float) -> tuple[float, Batch] | None:
        """A batch is done: count it as Triton does, and start the next one."""
        self.free += 1
        heapq.heappop(self.running)
        compute_us = (now - batch[0].started) * 1e6
        for job in batch:
            self.success += 1
            self.queue_us += (job.started - job.arrived) * 1e6
            self.compute_us += compute_us
        # After members left, an instance that finishes may be one that is gone (free not above 0).
        return self._start(now) if self.queue and self.free > 0 else None

    def _start(self, now: float) -> tuple[float, Batch]:
        queue = self.queue
        if self.max_batch == 1:
            batch = [queue.popleft()]
        else:
            batch = [queue.popleft() for _ in range(min(self.max_batch, len(queue)))]
        for job in batch:
            job.started = now
        self.free -= 1
        seconds = batch[0].local_ms * (1 + self.growth * (len(batch) - 1)) / 1000
        end = now + seconds
        self.committed_s += seconds
        heapq.heappush(self.running, end)
        return end, batch

    def busy_s(self, now: float) -> float:
        """Model-instance seconds spent so far (the GPU utilisation's numerator)."""
        return self.committed_s - sum(max(0.0, end - now) for end in self.running)

    def counters(self) -> Counters:
        return Counters(self.success, self.queue_us, self.compute_us, float(len(self.queue)))

    def wait_if_sent(self, now: float, limit_s: float = math.inf) -> float:
        """The true wait (s) of a request sent now, before it starts: an oracle no runner has.
        Past ``limit_s`` the answer is only some wait longer than that (a long queue is not walked)."""
        return max(0.0, self.free_at(now, limit_s)[0] - now)

    def free_at(self, now: float, limit_s: float = math.inf) -> list[float]:
        """When each model instance is next free for a request sent now (a heap, the soonest
        first), once the queue ahead has run; walked only until the soonest passes ``limit_s``."""
        ends = [now] * self.free + list(self.running)
        heapq.heapify(ends)
        queued = iter(self.queue)
        while ends[0] - now <= limit_s and (batch := list(itertools.islice(queued, self.max_batch))):
            first = heapq.heappop(ends)
            heapq.heappush(ends, first + batch[0].local_ms * (1 + self.growth * (len(batch) - 1)) / 1000)
        return ends
