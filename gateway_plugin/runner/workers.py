"""Several runner processes on APISIX's one socket: the parent listens, its workers accept.

The parent binds the socket once and starts each worker as a fresh process that inherits it
(``launch``); the kernel hands each connection APISIX opens to one of them. The parent only
supervises: a worker that exits is started again (after 0.5 s, doubling up to 10 s while it keeps
failing); a worker that has beaten (``HEARTBEAT`` from its event loop every ``HEARTBEAT_S``) and
then stays silent for ``STALL_S`` is alive but serves nobody (a blocked loop, a stopped process):
it is killed, and so started again, and APISIX's calls it held end at once instead of waiting out
their 60 s timeout; SIGHUP is passed on to every worker (each reloads its config); SIGTERM or
SIGINT stops them all (SIGTERM, then SIGKILL after a grace period) before the parent returns.
Signals are taken synchronously (``sigtimedwait``), so the caller blocks them before starting any
thread.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("spillway.workers")

SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
FIRST_DELAY_S, MAX_DELAY_S, HEALTHY_AFTER_S, GRACE_S = 0.5, 10.0, 30.0, 15.0
HEARTBEAT, HEARTBEAT_S, STALL_S = b"\x00", 0.5, 5.0

Launch = Callable[[int], "subprocess.Popen[bytes]"]
# Whether worker ``index`` has beaten since it was last asked.
Heard = Callable[[int], bool]


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    due: float = 0.0
    beat: float | None = None


class Supervisor:
    def __init__(
        self,
        count: int,
        launch: Launch,
        clock: Callable[[], float] = time.monotonic,
        heard: Heard = lambda _: False,
    ) -> None:
        self.slots = [_Slot(i) for i in range(count)]
        self.launch, self.clock, self.heard = launch, clock, heard
        self.restarts = self.stalls = 0

    def run(self) -> int:
        """Start the workers and keep them running until SIGTERM or SIGINT; the exit status."""
        for slot in self.slots:
            self._start(slot)
        while True:
            info = signal.sigtimedwait(SIGNALS, 0.25)
            if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
                self.stop()
                return 0
            if info is not None and info.si_signo == signal.SIGHUP:
                self._send(signal.SIGHUP)
            self._tend()

    def _start(self, slot: _Slot) -> None:
        try:
            slot.proc = self.launch(slot.index)
        except OSError as exc:
            log.error("cannot start worker %d: %s", slot.index, exc)
            self._later(slot)
            return
        slot.started, slot.beat = self.clock(), None
        log.info("worker %d started (pid %d)", slot.index, slot.proc.pid)

    def _later(self, slot: _Slot) -> None:
        slot.proc = None
        slot.due = self.clock() + min(MAX_DELAY_S, FIRST_DELAY_S * 2**slot.failures)
        slot.failures += 1

    def _tend(self) -> None:
        """Kill workers that stopped beating, reap those that exited, start again those whose
        delay is over."""
        now = self.clock()
        for slot in self.slots:
            if slot.proc is not None and self.heard(slot.index):
                slot.beat = now
            if slot.proc is not None and slot.beat is not None and now - slot.beat > STALL_S:
                log.error(
                    "worker %d (pid %d) has not beaten for %g s: alive but serving nobody; killed",
                    slot.index,
                    slot.proc.pid,
                    STALL_S,
                )
                slot.proc.kill()
                slot.proc.wait()
                slot.beat = None
                self.stalls += 1
            if slot.proc is not None and slot.proc.poll() is not None:
                if now - slot.started > HEALTHY_AFTER_S:
                    slot.failures = 0
                log.warning(
                    "worker %d (pid %d) exited with %s; starting it again",
                    slot.index,
                    slot.proc.pid,
                    slot.proc.returncode,
                )
                self._later(slot)
            if slot.proc is None and now >= slot.due:
                self.restarts += 1
                self._start(slot)

    def _send(self, signo: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signo)

    def stop(self) -> None:
        self._send(signal.SIGTERM)
        deadline = self.clock() + GRACE_S
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                slot.proc.wait(max(0.0, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop in %g s; killed", slot.index, GRACE_S)
                slot.proc.kill()
                slot.proc.wait()
