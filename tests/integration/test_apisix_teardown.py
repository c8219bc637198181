"""What ``devtools.apisix`` leaves behind when a gateway stops: nothing. A runner that outlives
APISIX's quit (here a stand-in that ignores SIGTERM: the point is a process that will not go) kept
scraping and holding ports into the next test, and the next start at the prefix stopped at the
event socket a killed master left. A runner killed outright left its socket (named after the
master's pid), and once pids wrapped a later gateway whose master got that pid was "up" before its
runner was: its first requests got 503."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from devtools import apisix
from functions.sidecar import free_port
from testing.apisix import needs_apisix

pytestmark = [pytest.mark.integration, needs_apisix()]

STUBBORN_RUNNER = """
import os, signal, socket, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
listener = socket.socket(socket.AF_UNIX)
listener.bind(os.environ["APISIX_LISTEN_ADDRESS"].removeprefix("unix:"))
listener.listen()
time.sleep(600)
"""


# A runner slow to start: it binds its socket 2 s after APISIX started it.
SLOW_RUNNER = """
import os, socket, time
time.sleep(2)
path = os.environ["APISIX_LISTEN_ADDRESS"].removeprefix("unix:")
if os.path.exists(path):
    os.unlink(path)
listener = socket.socket(socket.AF_UNIX)
listener.bind(path)
listener.listen()
time.sleep(600)
"""


def _settings(tmp_path: Path, runner: str = STUBBORN_RUNNER) -> apisix.ApisixSettings:
    script = tmp_path / "runner.py"
    script.write_text(runner)
    return apisix.ApisixSettings(
        port=free_port(), routes_yaml="routes: []\n#END\n", runner_cmd=[sys.executable, str(script)]
    )


def test_a_runner_that_ignores_sigterm_is_stopped_with_the_gateway(tmp_path: Path) -> None:
    with apisix.running(_settings(tmp_path)) as gateway:
        runners = gateway.runner_pids()
        assert runners and all(apisix.alive(p) for p in runners)
    assert not any(apisix.alive(p) for p in runners), "no runner outlives the gateway"
    assert not gateway.runner_socket().exists(), "nor the socket of a runner killed outright"


def test_a_gateway_is_up_once_its_runner_accepts_not_when_a_stale_socket_has_its_name(
    tmp_path: Path,
) -> None:
    """Sockets a killed runner would have left, for the pids the next master may get."""
    conf = apisix.prefix() / "apisix" / "conf"
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())  # pids are handed out after it
    names = [conf / f"apisix-{300 + (last + n - 300) % (pid_max - 300)}.sock" for n in range(1, 2000)]
    made = [name for name in names if not name.exists()]
    for name in made:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(name))
    try:
        with apisix.running(_settings(tmp_path, SLOW_RUNNER)) as gateway:
            assert gateway.runner_socket() in names, "the master's pid is among those prepared"
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(gateway.runner_socket()))
    finally:
        for name in made:
            name.unlink(missing_ok=True)


def test_a_master_killed_outright_leaves_nothing_that_stops_the_next_start(tmp_path: Path) -> None:
    first = apisix.Apisix(_settings(tmp_path))
    first.start()
    workers = first.worker_pids()
    assert first.master_pid is not None
    os.kill(first.master_pid, signal.SIGKILL)
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    first.stop()
    with apisix.running(_settings(tmp_path)) as second:
        assert second.master_pid != first.master_pid
