"""APISIX's hold on the runner, on a real Apache APISIX 3.18: respawn after a kill, a new token
after the runner forgot one, and a clean ``apisix quit``. (Its own module: one APISIX at a time.)"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from devtools import apisix
from testing.apisix import gateway_for, needs_apisix
from testing.http import http, wait_until
from testing.standins import stand_ins

pytestmark = [pytest.mark.integration, needs_apisix()]


def test_lifecycle_respawn_token_expiry_and_quit(tmp_path: Path) -> None:
    """Killing the runner: APISIX respawns it and routing resumes (clients get 503 meanwhile); a
    runner that forgot a token answers CONF_TOKEN_NOT_FOUND and APISIX prepares again; ``apisix
    quit`` stops the runner and removes its socket."""
    with stand_ins(aws_instance=None) as trio:
        config = trio.config()
        config["runner"] = {"conf_ttl_s": 1.0}
        with gateway_for(config, tmp_path) as gateway:
            url = gateway.url + "/v2/models/add_sub/infer"
            assert http("POST", url, b"{}")[0] == 200
            first_runner = gateway.runner_pids()[-1]
            statuses: list[int] = []

            def prepared_again() -> bool:
                """Requests until the runner's conf TTL (1 s, set above) runs out on its own clock
                and APISIX hears CONF_TOKEN_NOT_FOUND."""
                statuses.append(http("POST", url, b"{}")[0])
                return "refresh cache and try again" in gateway.error_log()

            wait_until(prepared_again, 30, "a token the runner forgot")
            assert http("POST", url, b"{}")[0] == 200
            assert set(statuses) == {200}, f"an expired token is prepared again: {statuses}"
            os.kill(first_runner, signal.SIGKILL)
            seen: list[int] = []

            def resumed() -> bool:
                seen.append(http("POST", url, b"{}")[0])
                return seen[-1] == 200 and len(gateway.runner_pids()) > 1

            wait_until(resumed, 60, "routing resumes with a respawned runner")
            assert set(seen) == {200, 503} and seen[-1] == 200, f"503 until the respawn, then 200: {seen}"
            assert seen.index(200) > seen.index(503), f"503 until the respawn, then 200: {seen}"
            print(f"runner killed: {seen.count(503)} answers of 503 before routing resumed")
            socket = gateway.runner_socket()
        runner = gateway.runner_pids()[-1]
        assert not Path(f"/proc/{runner}").exists(), "apisix quit stopped the runner"
        assert not socket.exists(), "and the runner removed its socket"


def test_a_runner_that_stops_answering_is_treated_as_a_dead_one(tmp_path: Path) -> None:
    """Before: a runner alive but not answering (SIGSTOP here; a blocked event loop looks the same
    to APISIX) held every request on the ext-plugin route for ext-plugin's 60 s socket timeout. Now
    the edge, which asks the runner every alive_interval_s, answers 503 at once once it has been
    silent for dead_after_s, and after kill_after_s stops it; APISIX starts it anew, as a dead one,
    and the requests it held get their answer then."""
    attr = {"alive_interval_s": 0.2, "dead_after_s": 1, "kill_after_s": 3}
    with stand_ins(aws_instance=None) as trio, gateway_for(trio.config(), tmp_path, attr=attr) as gateway:
        url = gateway.url + "/v2/models/add_sub/infer"
        assert http("POST", url, b"{}")[0] == 200
        wait_until(
            lambda: "watches whether this runner answers" in gateway.error_log(), 30, "the edge watching"
        )
        wedged = gateway.runner_pids()[-1]
        os.kill(wedged, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            # Sent to the stopped runner: answered once it is stopped for good, well before APISIX's
            # 60 s (the client gives up at 45 s, so a request left to time out fails the test).
            held = pool.submit(http, "POST", url, b"{}", None, 45)
            wait_until(
                lambda: b"has not answered" in http("POST", url, b"{}")[2],
                30,
                "503 at once for a silent runner",
            )
            assert held.result()[0] == 503
        wait_until(lambda: len(gateway.runner_pids()) > 1, 60, "APISIX starts the runner anew")
        wait_until(lambda: http("POST", url, b"{}")[0] == 200, 60, "routing resumes")
        assert not apisix.alive(wedged), "the silent runner was stopped"
        assert "has not answered for 3 s; stopped it (SIGKILL)" in gateway.error_log()
