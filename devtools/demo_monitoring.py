"""The demo's Prometheus: Debian's, on loopback, scraping the runner, the on-prem Triton, APISIX's
exporter and every function instance the pools start (listed in a file Prometheus rereads), and
evaluating Spillway's rules while the load runs; afterwards Spillway's dashboards are drawn from
its answers into the report (``dashboard_render``), each with the queries behind its panels."""

from __future__ import annotations

import base64
import html
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devtools import prometheus as prometheus_server
from devtools.dashboard_render import render
from devtools.local_pool import LocalFunctionPool
from functions.contract import METRICS_PATH
from functions.sidecar import free_port

DASHBOARDS = Path(__file__).resolve().parent.parent / "ops" / "grafana" / "dashboards"
# What the demo's function instances take for a scrape instead of a signature.
METRICS_TOKEN = "spillway-demo-metrics-token"


@contextmanager
def monitoring(
    out_dir: Path,
    runner_port: int,
    triton_metrics_port: int,
    apisix_exporter: str | None,
    pools: dict[str, LocalFunctionPool],
) -> Iterator[prometheus_server.Prometheus | None]:
    """A Prometheus while the demo runs; None where it is not installed (the report says so)."""
    if prometheus_server.missing_reason() is not None:
        yield None
        return
    listed = {name: out_dir / "prometheus" / f"functions-{name}.json" for name in pools}
    jobs = [
        *(
            prometheus_server.Job(f"spillway-function-{name}", (), METRICS_PATH, METRICS_TOKEN, listed[name])
            for name in pools
        ),
        prometheus_server.Job("spillway-runner", (f"127.0.0.1:{runner_port}",)),
        prometheus_server.Job("triton-onprem", (f"127.0.0.1:{triton_metrics_port}",)),
    ]
    if apisix_exporter is not None:
        jobs.append(prometheus_server.Job("apisix", (apisix_exporter,), "/apisix/prometheus/metrics"))
    stop = threading.Event()

    def list_instances() -> None:
        while True:
            for name, pool in pools.items():
                text = json.dumps([{"targets": pool.addresses()}])
                tmp = listed[name].with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(listed[name])
            if stop.wait(0.5):
                return

    (out_dir / "prometheus").mkdir(parents=True, exist_ok=True)
    lister = threading.Thread(target=list_instances, name="demo-function-targets", daemon=True)
    lister.start()
    try:
        with prometheus_server.running(free_port(), jobs, out_dir / "prometheus") as prometheus:
            yield prometheus
    finally:
        stop.set()
        lister.join(5)


def render_dashboards(
    prometheus: prometheus_server.Prometheus, out_dir: Path, start: float, end: float
) -> dict[str, Any]:
    """Each dashboard drawn over the run: file name → (PNG path, the panels with data and the
    titles of those without)."""
    drawn: dict[str, Any] = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        png = out_dir / "dashboards" / f"{path.stem}.png"
        empty = render(prometheus, path, start, end, png)
        panels = len(json.loads(path.read_text())["panels"])
        drawn[path.name] = {"png": str(png), "panels_with_data": panels - len(empty), "without_data": empty}
    return drawn


def dashboards_html(result: dict[str, Any]) -> str:
    """The report's section: each dashboard as drawn, and the PromQL of every panel."""
    drawn = result.get("dashboards")
    if not drawn:
        return (
            "<h2>Dashboards</h2><p>Not drawn: Prometheus is not installed here "
            "(scripts/setup.sh installs Debian's package).</p>"
        )
    parts = [
        "<h2>Dashboards</h2><p>Spillway's Grafana dashboards (ops/grafana/dashboards), drawn from "
        "the demo's own Prometheus; each panel's queries are listed under it.</p>"
    ]
    for name, shown in drawn.items():
        board = json.loads((DASHBOARDS / name).read_text())
        image = base64.b64encode(Path(shown["png"]).read_bytes()).decode()
        queries = "".join(
            f"<li><b>{html.escape(panel['title'])}</b>: "
            + "; ".join(f"<code>{html.escape(t['expr'])}</code>" for t in panel["targets"])
            + "</li>"
            for panel in board["panels"]
        )
        title = html.escape(board["title"])
        parts.append(
            f"<h3>{title}</h3><figure><img class='chart' alt='{title}' "
            f"src='data:image/png;base64,{image}'></figure>"
            f"<details><summary>queries</summary><ul>{queries}</ul></details>"
        )
    return "".join(parts)
