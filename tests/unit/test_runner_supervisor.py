"""The supervisor of several runner workers, on a clock the test moves: which silent worker it
kills, and which it leaves alone."""

from __future__ import annotations

import subprocess
from typing import Any, cast

from gateway_plugin.runner.workers import STALL_S, Supervisor


class FakeWorker:
    """A worker process as the supervisor sees it: alive until killed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


def test_a_worker_silent_after_beating_is_killed_and_started_again() -> None:
    now = [0.0]
    beating = {0: True, 1: True}
    started: list[FakeWorker] = []

    def launch(index: int) -> subprocess.Popen[bytes]:
        started.append(FakeWorker(100 + len(started)))
        return cast("subprocess.Popen[bytes]", started[-1])

    supervisor = Supervisor(2, launch, clock=lambda: now[0], heard=lambda i: beating[i])
    for slot in supervisor.slots:
        supervisor._start(slot)
    supervisor._tend()
    beating[0] = False  # worker 0's loop stops turning; worker 1 keeps beating
    now[0] = STALL_S - 0.1
    supervisor._tend()
    assert started[0].returncode is None, "not yet silent for STALL_S"
    now[0] = STALL_S + 0.1
    supervisor._tend()
    assert started[0].returncode == -9 and started[1].returncode is None
    assert supervisor.stalls == 1
    now[0] += 1.0  # past the restart delay
    supervisor._tend()
    assert len(started) == 3 and supervisor.slots[0].proc is cast(Any, started[2])


def test_a_worker_that_never_beat_is_left_to_start() -> None:
    """Imports, config and the shared store can take a while on a busy host: only a worker that
    beat once and then went silent is known to be stuck."""
    now = [0.0]
    workers: list[FakeWorker] = []

    def launch(index: int) -> subprocess.Popen[bytes]:
        workers.append(FakeWorker(200))
        return cast("subprocess.Popen[bytes]", workers[-1])

    supervisor = Supervisor(1, launch, clock=lambda: now[0], heard=lambda i: False)
    supervisor._start(supervisor.slots[0])
    now[0] = 10 * STALL_S
    supervisor._tend()
    assert workers[0].returncode is None and supervisor.stalls == 0
