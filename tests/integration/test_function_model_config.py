"""Triton's own tools against a function: perf_analyzer reads each model's configuration (and
Triton's statistics) before it sends anything. Both stay closed by default; one setting each opens
them, read-only, so the field's standard tool measures a deployed function as shipped."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from functions.surface import check
from testing.function import function_server, model_repository
from testing.paths import tool

pytestmark = pytest.mark.integration


def test_a_models_configuration_is_closed_unless_opened_and_then_only_read() -> None:
    refusal = check("GET", "/v2/models/add_sub/config", expose_statistics=False)
    assert (
        refusal is not None and refusal.status == 403 and "SPILLWAY_EXPOSE_MODEL_CONFIG=1" in refusal.message
    )
    assert check("GET", "/v2/models/add_sub/versions/1/config", False, expose_config=True) is None
    posted = check("POST", "/v2/models/add_sub/config", False, expose_config=True)
    assert posted is not None and posted.status == 405
    load = check("POST", "/v2/repository/models/add_sub/load", False, expose_config=True)
    assert load is not None and load.status == 403


def _perf_analyzer(url: str) -> subprocess.CompletedProcess[str]:
    analyzer = tool("perf_analyzer")
    env = {**os.environ, "LD_LIBRARY_PATH": str(analyzer.parent.parent / "lib")}
    return subprocess.run(
        [
            str(analyzer),
            "-m",
            "add_sub",
            "-u",
            url.removeprefix("http://"),
            "-i",
            "http",
            "--concurrency-range",
            "1:1",
            "-p",
            "500",
            # Any stability will do: what is proven is that it measures at all.
            "-s",
            "1000",
            "-r",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_perf_analyzer_measures_a_function_once_its_settings_open_what_it_reads(tmp_path: Path) -> None:
    repo = model_repository(tmp_path, "add_sub")
    with function_server(repo, tmp_path) as closed:
        refused = _perf_analyzer(closed.url)
    assert refused.returncode != 0 and "model config" in (refused.stdout + refused.stderr).lower()
    with function_server(
        repo, tmp_path, SPILLWAY_EXPOSE_MODEL_CONFIG="1", SPILLWAY_EXPOSE_STATISTICS="1"
    ) as opened:
        measured = _perf_analyzer(opened.url)
    assert measured.returncode == 0, measured.stdout + measured.stderr
    assert "Throughput" in measured.stdout
