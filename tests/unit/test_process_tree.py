"""What the sidecar and the tests read of a process tree from ``/proc``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from functions.process_tree import alive, children, descendants
from testing.http import wait_until


def test_a_child_is_found_and_alive_until_it_exits_and_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert child.pid in children(os.getpid())
        assert alive(child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
    child.wait(10)
    assert not alive(child.pid)
    assert child.pid not in children(os.getpid())


def test_a_zombie_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    try:
        assert not alive(child.pid)
    finally:
        child.wait(10)


def test_descendants_reach_a_grandchild() -> None:
    """A grandchild (what a backend stub is to the emulator) is found below its grandparent."""
    sleeper = "import time; time.sleep(60)"
    script = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {sleeper!r}]).wait()"
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_until(lambda: bool(descendants(child.pid)), 10, "the child's own child")
        grandchildren = descendants(child.pid)
        assert len(grandchildren) == 1
        assert child.pid in descendants(os.getpid())
        assert grandchildren <= descendants(os.getpid())
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, signal.SIGKILL)
        child.wait(10)
