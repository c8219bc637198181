"""``runner.workers: N``: N runner processes behind APISIX's one socket, sharing state through Redis.

The parent binds the socket and serves the outcome endpoint; each worker is ``python -m
gateway_plugin run`` again, told by ``SPILLWAY_WORKER`` its index and the two descriptors it
inherits: the listening socket and its end of a message channel from the parent. Every decision
names its worker (``X-Spillway-Worker``, logged by the route's http-logger), so the parent sends
each outcome back to the worker whose books it closes. Budgets, caps, breakers, quotas and warm
instances are shared between the workers as between gateways: through ``shared_state``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from gateway_plugin.books import outcomes
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.outcome_listener import open_outcome_listener
from gateway_plugin.runner import socket_identity, unlink_if_ours
from gateway_plugin.runner.listener import bind
from gateway_plugin.runner.workers import SIGNALS, Supervisor

log = logging.getLogger("spillway.workers")

WORKER_ENV = "SPILLWAY_WORKER"


class WorkerLink(NamedTuple):
    """What a worker inherits from its parent."""

    worker: int
    listen_fd: int
    outcome_fd: int

    @classmethod
    def from_env(cls) -> WorkerLink | None:
        raw = os.environ.get(WORKER_ENV)
        if not raw:
            return None
        worker, listen_fd, outcome_fd = (int(part) for part in raw.split(":"))
        return cls(worker, listen_fd, outcome_fd)

    def sockets(self) -> tuple[socket.socket, socket.socket]:
        return socket.socket(fileno=self.listen_fd), socket.socket(fileno=self.outcome_fd)


class OutcomeFanOut:
    """Sends each outcome to the worker named in it (worker 0 when none or an unknown one is);
    a worker too busy to take a batch loses it, never the parent's thread."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.channels: dict[int, socket.socket] = {}
        self.dropped = 0
        self.warnings = outcomes.OutcomeWarnings()

    def deliver(self, raw: list[object]) -> None:
        """A batch's entries, checked here (each forwarded one names the fields found malformed)."""
        read = outcomes.read_entries(raw)
        self.warnings.said(read)
        by_worker: dict[int, list[dict[str, object]]] = {}
        for entry in read.entries:
            worker = entry.worker or ""
            # The header can be the client's own (a stop never reaches the upstream): any text.
            index = int(worker) if worker.isascii() and worker.isdigit() and int(worker) < self.count else 0
            by_worker.setdefault(index, []).append(entry.model_dump(exclude_none=True))
        for index, batch in by_worker.items():
            for chunk in _chunks(batch):
                self._send(index, chunk)

    def heard(self, index: int) -> bool:
        """Whether worker ``index`` beat since the last call (its beats are drained)."""
        channel, beaten = self.channels.get(index), False
        while channel is not None:
            try:
                data = channel.recv(16, socket.MSG_DONTWAIT)
            except OSError:
                break
            if not data:  # the worker is gone: the supervisor reaps it
                break
            beaten = True
        return beaten

    def _send(self, index: int, data: bytes) -> None:
        channel = self.channels.get(index)
        try:
            if channel is None:
                raise OSError("worker not running")
            channel.send(data, socket.MSG_DONTWAIT)
        except OSError as exc:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "outcomes for worker %d dropped (%d batches so far): %s", index, self.dropped, exc
                )


def _chunks(batch: list[dict[str, object]]) -> list[bytes]:
    """JSON arrays of at most ``MAX_MESSAGE_BYTES`` each (one entry is bounded well below it)."""
    out: list[bytes] = []
    part: list[str] = []
    size = 2
    for entry in batch:
        text = json.dumps(entry)
        if part and size + len(text) + 1 > outcomes.MAX_MESSAGE_BYTES:
            out.append(("[" + ",".join(part) + "]").encode())
            part, size = [], 2
        part.append(text)
        size += len(text) + 1
    if part:
        out.append(("[" + ",".join(part) + "]").encode())
    return out


def supervise(config: SpillwayConfig, config_path: Path | None, path: Path, secrets: GatewaySecrets) -> int:
    """The parent: bind, serve outcomes, keep ``runner.workers`` workers running, clean up."""
    count = config.runner.workers
    listening = bind(path, config.runner.socket_group)
    identity = socket_identity(path)
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    fan_out = OutcomeFanOut(count)
    listener = open_outcome_listener(config, secrets, None, fan_out.deliver)

    def launch(index: int) -> subprocess.Popen[bytes]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * outcomes.MAX_MESSAGE_BYTES)
        command = [sys.executable, "-m", "gateway_plugin", "run"]
        if config_path is not None:
            command += ["--config", str(config_path)]
        env = {**os.environ, WORKER_ENV: f"{index}:{listening.fileno()}:{theirs.fileno()}"}
        try:
            proc = subprocess.Popen(command, env=env, pass_fds=(listening.fileno(), theirs.fileno()))
        finally:
            theirs.close()
        old = fan_out.channels.get(index)
        fan_out.channels[index] = ours
        if old is not None:
            old.close()
        return proc

    log.info("listening on %s with %d workers", path, count)
    try:
        return Supervisor(count, launch, heard=fan_out.heard).run()
    finally:
        if listener is not None:
            listener.close()
        listening.close()
        unlink_if_ours(path, identity)
