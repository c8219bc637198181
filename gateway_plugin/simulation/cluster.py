"""The on-prem cluster as Triton runs it: a FIFO queue in front of ``parallelism`` model instances,
the dynamic batcher taking up to ``max_batch`` queued requests at once, and the counters its
Prometheus endpoint exposes (successes, cumulative queue and compute time, pending requests)."""

from __future__ import annotations

import heapq
from collections import deque

from gateway_plugin.routing.signals import Counters
from gateway_plugin.simulation.settings import SimulatedCluster


class Job:
    """One simulated request; its random draws are made once, so every policy sees the same ones."""

    __slots__ = (
        "arrived",
        "at",
        "body_bytes",
        "cloud_z",
        "confidential",
        "local_ms",
        "started",
        "target",
        "tenant",
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
        self.tenant: str | None = None
        self.arrived = at
        self.started = at


Batch = list[Job]


class Cluster:
    def __init__(self, servers: int, settings: SimulatedCluster) -> None:
        self.servers = servers
        self.free = servers
        self.max_batch = settings.max_batch
        self.growth = settings.batch_growth
        self.queue: deque[Job] = deque()
        self.running: list[float] = []
        self.success = 0
        self.queue_us = 0.0
        self.compute_us = 0.0
        self.committed_s = 0.0

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
        return self._start(now) if self.queue else None

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

    def wait_if_sent(self, now: float) -> float:
        """The true wait (s) of a request sent now, before it starts: an oracle no runner has."""
        if self.free and not self.queue:
            return 0.0
        ends = [now] * self.free + list(self.running)
        heapq.heapify(ends)
        step = self.max_batch
        queued = list(self.queue)
        for i in range(0, len(queued), step):
            first = heapq.heappop(ends)
            n = len(queued[i : i + step])
            heapq.heappush(ends, first + queued[i].local_ms * (1 + self.growth * (n - 1)) / 1000)
        return max(0.0, ends[0] - now)
