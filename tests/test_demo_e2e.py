"""The whole hybrid, end to end: the README's first command in its short form, checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.integration


def test_demo_spills_the_burst_keeps_sensitive_data_home_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "devtools", "demo", "--short", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checks"]["every_request_answered_once"], summary
    assert summary["checks"]["no_sensitive_request_in_cloud_logs"], summary
    assert summary["checks"]["local_p99_within_target"], summary
    assert summary["checks"]["cold_hits_within_warmup_bound"], summary
    assert done.returncode == 0, done.stderr[-3000:]
    cloud = {t: v for t, v in summary["targets"].items() if t in ("aws", "aliyun")}
    assert sum(v["requests"] for v in cloud.values()) > 0, "the burst did not spill"
    assert summary["cloud_requests_in_logs"] == sum(v["requests"] for v in cloud.values()), (
        "the function instances' own logs must account for every request the gateway sent out"
    )
    assert summary["targets"]["local"]["sensitive"] > 0 and all(v["sensitive"] == 0 for v in cloud.values())
    assert (out / "report.html").read_text().startswith("<!doctype html>")
    assert json.loads((out / "results.json").read_text())["sent"] == summary["requests"]
