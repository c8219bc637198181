"""A real Prometheus (Debian's package, installed by ``scripts/setup.sh``) on loopback, scraping what
the demo or a test started and evaluating Spillway's rules: for the tests, the demo and the report.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "ops" / "prometheus" / "spillway-rules.yml"
INSTALL_HINT = "prometheus is not installed (scripts/setup.sh installs Debian's package with apt)"


def missing_reason() -> str | None:
    return None if shutil.which("prometheus") else INSTALL_HINT


@dataclass(frozen=True)
class Job:
    name: str
    targets: tuple[str, ...]
    metrics_path: str = "/metrics"
    bearer: str | None = None  # a function's SPILLWAY_METRICS_TOKEN
    file_sd: Path | None = None  # targets that come and go, listed in this file (Prometheus rereads it)


@dataclass
class Prometheus:
    port: int
    jobs: list[Job]
    data: Path
    interval_s: float = 1.0
    rules: tuple[Path, ...] = (RULES,)
    url: str = ""
    log: Path | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def config(self) -> dict[str, Any]:
        interval = f"{int(self.interval_s * 1000)}ms"
        return {
            "global": {
                "scrape_interval": interval,
                "evaluation_interval": interval,
                "scrape_timeout": interval,
            },
            "rule_files": [str(r) for r in self.rules],
            "scrape_configs": [self._job(j) for j in self.jobs],
        }

    @staticmethod
    def _job(job: Job) -> dict[str, Any]:
        config: dict[str, Any] = {
            "job_name": job.name,
            "metrics_path": job.metrics_path,
            "static_configs": [{"targets": list(job.targets)}],
        }
        if job.file_sd is not None:
            config["file_sd_configs"] = [{"files": [str(job.file_sd)], "refresh_interval": "1s"}]
        if job.bearer is not None:
            config["authorization"] = {"type": "Bearer", "credentials": job.bearer}
        return config

    def start(self, timeout_s: float = 60.0) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        config = self.data / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.data / "prometheus.log"
        with self.log.open("wb") as sink:
            self._proc = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.data / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready within {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise ValueError(f"Prometheus answered {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        return list(self.api("query", **params)["result"])

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step_s:.3f}"
        )
        return list(data["result"])

    def scraped_since(self, at: float) -> bool:
        """Whether every target has been scraped after ``at`` (wall clock), answered or not."""
        targets = self.api("targets")["activeTargets"]
        return bool(targets) and all(
            t["health"] != "unknown" and _epoch(t["lastScrape"]) > at for t in targets
        )

    def targets_up(self) -> dict[str, bool]:
        """Scrape job → whether every one of its targets answered its last scrape."""
        up: dict[str, bool] = {}
        for target in self.api("targets")["activeTargets"]:
            job = target["labels"]["job"]
            up[job] = up.get(job, True) and target["health"] == "up"
        return up


def _epoch(stamp: str) -> float:
    """Prometheus' RFC 3339 time with nanoseconds, as seconds since the epoch."""
    from datetime import datetime

    whole, _, fraction = stamp.rstrip("Z").partition(".")
    offset = ""
    for sign in ("+", "-"):
        if sign in fraction:
            fraction, _, offset = fraction.partition(sign)
            offset = sign + offset
    parsed = datetime.fromisoformat(whole + (offset or "+00:00"))
    return parsed.timestamp() + float("0." + (fraction or "0"))


@contextmanager
def running(port: int, jobs: list[Job], data: Path, interval_s: float = 1.0) -> Iterator[Prometheus]:
    prometheus = Prometheus(port, jobs, data, interval_s)
    prometheus.start()
    try:
        yield prometheus
    finally:
        prometheus.stop()
