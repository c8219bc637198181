"""The simulator against reality: the demo's parts (real Triton, runner, development gateway,
function pools) take a bursty trace; the simulator replays the same requests with the same config.

Only what no machine's speed can move is checked here: the real run answers everything, the
simulator replays every request it sent, neither side lets an on-prem-only request out, the floor
taken from the real run is at least the model's own service time, and both sides spill in the
burst (one and a half times the cluster's capacity, which the model's sleep sets). How close the
simulated p99 and cloud share come to the real ones is a measurement of this machine as much as
of the simulator: ``bench/simulation_calibration.py`` measures it, ``bench/RESULTS.md`` holds it.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from devtools import demo
from devtools.sim_calibration import calibrate

pytestmark = pytest.mark.integration


def test_the_simulator_replays_the_real_stacks_requests_under_its_floor_and_residency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The demo sets these in the environment when unset: set here, they are gone after the test.
    monkeypatch.setenv("SPILLWAY_SIGNING_KEY", demo.SIGNING_KEY)
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
    figures = calibrate(tmp_path)
    real, sim = figures["real"], figures["simulated"]
    report = f"{figures}"
    assert figures["errors"] == 0, "the real run must answer everything"
    assert sim["requests"] == figures["requests"], report
    assert real["residency_breaches"] == 0 and sim["residency_breaches"] == 0, report
    assert figures["floor"]["service_ms"] >= figures["local_delay_ms"], "the model sleeps that long"
    assert real["cloud_share"] > 0 and sim["cloud_share"] > 0, report
    assert real["p99_ms"] >= figures["local_delay_ms"] and sim["p99_ms"] >= figures["local_delay_ms"], report
