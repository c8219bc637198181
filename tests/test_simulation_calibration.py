"""The simulator against reality: the demo's parts (real Triton, runner, development gateway,
function pools) take a bursty trace; the simulator replays the same requests with the same config.
The simulated p99 must be within 15 % of the real one, the cloud share within 5 points."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from devtools import demo
from devtools.sim_calibration import calibrate

pytestmark = pytest.mark.integration

P99_TOLERANCE = 0.15
CLOUD_SHARE_POINTS = 0.05


def test_the_simulator_predicts_the_real_stacks_tail_and_cloud_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The demo sets these in the environment when unset: set here, they are gone after the test.
    monkeypatch.setenv("SPILLWAY_SIGNING_KEY", demo.SIGNING_KEY)
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
    figures = calibrate(tmp_path)
    assert figures["errors"] == 0, "the real run must answer everything"
    real, sim = figures["real"], figures["simulated"]
    report = f"real {real}, simulated {sim}"
    assert abs(sim["p99_ms"] - real["p99_ms"]) <= P99_TOLERANCE * real["p99_ms"], report
    assert abs(sim["cloud_share"] - real["cloud_share"]) <= CLOUD_SHARE_POINTS, report
