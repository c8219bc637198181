"""Kill the real Triton sidecar mid-traffic: every request is answered, 503s, then success again."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from testing.function import ADD_SUB_BODY, function_server, model_repository
from testing.http import http, wait_until

pytestmark = pytest.mark.integration


def test_sidecar_crash_mid_traffic_answers_every_request(tmp_path: Path) -> None:
    repo = model_repository(tmp_path, "add_sub")
    # (sent at, answered at, status, Retry-After)
    answers: list[tuple[float, float, int, str | None]] = []
    sent = 0
    stop = threading.Event()
    lock = threading.Lock()

    with function_server(repo, tmp_path, platform="local") as fc:
        url = fc.url + "/v2/models/add_sub/infer"

        def client() -> None:
            nonlocal sent
            while not stop.is_set():
                with lock:
                    sent += 1
                began = time.monotonic()
                status, headers, _ = http("POST", url, ADD_SUB_BODY, {"content-type": "application/json"})
                with lock:
                    answers.append((began, time.monotonic(), status, headers.get("retry-after")))

        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        wait_until(lambda: len(answers) > 50, 30, "traffic flowing")
        old_pid = fc.triton_pid()
        killed_at = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)

        def recovered() -> bool:
            """A success for a request sent after the kill: only a new Triton serves it (one
            answered after the kill may have been served before it)."""
            with lock:
                return any(began > killed_at and status == 200 for began, _, status, _ in answers[-3:])

        wait_until(recovered, 60, "sidecar restarted and serving")
        stop.set()
        for t in threads:
            t.join(30)
        new_pid = fc.triton_pid()
        log = fc.log_text()

    assert new_pid != old_pid
    assert "restarting" in log
    assert len(answers) == sent, "a request was left without an answer"
    after = [(status, retry) for _, at, status, retry in answers if at > killed_at]
    assert {status for status, _ in after} <= {200, 503}
    assert (503, "1") in after, "no 503 with Retry-After while the sidecar was down"
    assert after[-1][0] == 200
