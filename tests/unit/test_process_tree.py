"""What the sidecar and the tests read of a process tree from ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys

from functions.process_tree import alive, children


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
