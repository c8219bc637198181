"""What ``devtools.apisix`` leaves behind when a gateway stops: nothing. A runner that outlives
APISIX's quit (here a stand-in that ignores SIGTERM: the point is a process that will not go) kept
scraping and holding ports into the next test, and the next start at the prefix stopped at the
event socket a killed master left."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from devtools import apisix
from functions.sidecar import free_port
from tests.apisix_support import needs_apisix

pytestmark = [pytest.mark.integration, needs_apisix()]

STUBBORN_RUNNER = """
import os, signal, socket, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
listener = socket.socket(socket.AF_UNIX)
listener.bind(os.environ["APISIX_LISTEN_ADDRESS"].removeprefix("unix:"))
listener.listen()
time.sleep(600)
"""


def _settings(tmp_path: Path) -> apisix.ApisixSettings:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_RUNNER)
    return apisix.ApisixSettings(
        port=free_port(), routes_yaml="routes: []\n#END\n", runner_cmd=[sys.executable, str(script)]
    )


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_a_runner_that_ignores_sigterm_is_stopped_with_the_gateway(tmp_path: Path) -> None:
    with apisix.running(_settings(tmp_path)) as gateway:
        runners = gateway.runner_pids()
        assert runners and not any(_gone(p) for p in runners)
    assert all(_gone(p) for p in runners), "no runner outlives the gateway"


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
