"""``simulate --report DIR``: one self-contained HTML page (plots inlined) and results.json.

Plots need matplotlib (``pip install 'spillway[simulate]'``); without it the page holds the tables
and says how to get the plots.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

from gateway_plugin.simulation.results import CLOUD_KIND, SHED_KIND, Measures

WINDOW_S = 10
SHOWN = ("spillway", "perfect", "static_threshold", "all_local")


def write_report(out: Path, result: dict[str, Any], policies: dict[str, Measures]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    page = out / "report.html"
    page.write_text(render(result, policies))
    return page


def render(result: dict[str, Any], policies: dict[str, Measures]) -> str:
    charts = _charts(result, policies)
    body = [
        "<h1>Spillway simulation</h1>",
        f"<p>{result['requests']:,} requests; latency target {result['latency_target_ms']:g} ms.</p>",
        _table(result["policies"]),
    ]
    if charts is None:
        body.append("<p>Plots need matplotlib: <code>pip install 'spillway[simulate]'</code>.</p>")
    else:
        for name, png in charts.items():
            data = base64.b64encode(png).decode()
            body.append(
                f'<img class="chart" id="chart-{name}" alt="{name}" src="data:image/png;base64,{data}">'
            )
    for point in result.get("sweep", {}).get("points", []):
        body.append(f"<h2>{html.escape(result['sweep']['key'])} = {point['value']}</h2>")
        body.append(_table(point["policies"]))
    if "frontier" in result:
        body.append(_frontier_table(result["frontier"]))
    style = "body{font-family:sans-serif;max-width:1000px;margin:auto}td,th{padding:2px 8px;text-align:right}"
    head = f"<meta charset='utf-8'><title>Spillway simulation</title><style>{style}</style>"
    return f"<!doctype html><html><head>{head}</head><body>{''.join(body)}</body></html>\n"


def _table(policies: dict[str, dict[str, Any]]) -> str:
    keys = ("slo_attainment", "p50_ms", "p99_ms", "cloud_share", "cloud_cost_usd", "cold_hits", "shed")
    head = "".join(f"<th>{k}</th>" for k in ("policy", *keys))
    rows = "".join(
        f"<tr><th>{html.escape(name)}</th>" + "".join(f"<td>{figures[k]}</td>" for k in keys) + "</tr>"
        for name, figures in policies.items()
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def _frontier_table(frontier: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(p['policy'])}</th><td>{html.escape(_params(p))}</td>"
        f"<td>{p['slo_attainment']:.2%}</td><td>{p['cloud_cost_usd']:.4f}</td></tr>"
        for p in frontier["frontier"]
    )
    verdict = (
        f"dominated: up to {frontier['most_slo_points_more']} SLO points more at no more spend"
        if frontier["dominated"]
        else "dominated by no point"
    )
    head = "<tr><th>policy</th><th>parameters</th><th>SLO</th><th>spend USD</th></tr>"
    return f"<h2>Pareto frontier</h2><p>Spillway's default: {verdict}.</p><table>{head}{rows}</table>"


def _params(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in point["params"].items())


def _windows(
    m: Measures, value: Callable[[list[tuple[float, int]]], float]
) -> tuple[list[float], list[float]]:
    buckets: dict[int, list[tuple[float, int]]] = {}
    for at, ms, kind in zip(m.at, m.latency_ms, m.kinds, strict=True):
        buckets.setdefault(int(at // WINDOW_S), []).append((ms, kind))
    keys = sorted(buckets)
    return [k * WINDOW_S for k in keys], [value(buckets[k]) for k in keys]


def _p99(rows: list[tuple[float, int]]) -> float:
    answered = sorted(ms for ms, kind in rows if kind != SHED_KIND)
    return answered[int(0.99 * (len(answered) - 1))] if answered else 0.0


def _rate_of(kind: int) -> Callable[[list[tuple[float, int]]], float]:
    return lambda rows: sum(1 for row in rows if row[1] == kind) / WINDOW_S


def _charts(result: dict[str, Any], policies: dict[str, Measures]) -> dict[str, bytes] | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    charts: dict[str, bytes] = {}
    shown = [n for n in SHOWN if n in policies]

    fig, ax = plt.subplots(figsize=(9, 3.5))
    for name in shown:
        ax.plot(*_windows(policies[name], _p99), label=name)
    ax.axhline(result["latency_target_ms"], color="grey", linestyle=":", label="target")
    ax.set(yscale="log", xlabel="s", ylabel=f"p99 ms per {WINDOW_S} s", title="Latency over time")
    ax.legend()
    charts["latency"] = _png(fig, plt)

    fig, ax = plt.subplots(figsize=(9, 3.5))
    for label, kind in (("cloud", CLOUD_KIND), ("shed", SHED_KIND)):
        xs, ys = _windows(policies["spillway"], _rate_of(kind))
        ax.plot(xs, ys, label=label)
    xs, ys = _windows(policies["spillway"], lambda rows: len(rows) / WINDOW_S)
    ax.plot(xs, ys, label="all requests", color="black", linewidth=0.8)
    ax.set(xlabel="s", ylabel="requests/s", title="Spillway's traffic split")
    ax.legend()
    charts["split"] = _png(fig, plt)

    fig, ax = plt.subplots(figsize=(9, 3.5))
    for name in shown:
        spend = policies[name].cost_by_second
        seconds = sorted(spend)
        ax.plot(seconds, list(accumulate(spend[s] for s in seconds)), label=name)
    ax.set(xlabel="s", ylabel="USD", title="Cloud spend over time")
    ax.legend()
    charts["cost"] = _png(fig, plt)

    points = result.get("sweep", {}).get("points", [])
    if points:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for name in ("spillway", "perfect", "static_threshold"):
            xs = [p["policies"][name]["cloud_cost_usd"] for p in points]
            ys = [p["policies"][name]["slo_attainment"] for p in points]
            ax.plot(xs, ys, marker="o", label=name)
            for p, x, y in zip(points, xs, ys, strict=True):
                ax.annotate(str(p["value"]), (x, y), fontsize=8)
        ax.set(
            xlabel="cloud spend (USD)", ylabel="SLO attainment", title=f"Frontier: {result['sweep']['key']}"
        )
        ax.legend()
        charts["frontier"] = _png(fig, plt)
    if "frontier" in result:
        charts["pareto"] = pareto_png(result["frontier"], plt)
    return charts


def pareto_png(
    frontier: dict[str, Any], plt: Any, title: str = "Spend against SLO: every policy's points"
) -> bytes:
    """Every point of every sweep, the frontier through them, the oracle's, and Spillway's default;
    on the right, the same around the default."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for p in frontier["points"]:
        by_policy.setdefault(p["policy"], []).append(p)
    default = frontier["spillway_default"]
    for ax in axes:
        for name, points in by_policy.items():
            marker = {"spillway": "o", "oracle": "s"}.get(name, ".")
            xs, ys = [p["cloud_cost_usd"] for p in points], [p["slo_attainment"] for p in points]
            ax.scatter(xs, ys, marker=marker, label=name, alpha=0.8)
        for key, style, label in (
            ("frontier", "-", "frontier"),
            ("oracle_frontier", "--", "oracle's frontier"),
        ):
            line = frontier[key]
            xs, ys = [p["cloud_cost_usd"] for p in line], [p["slo_attainment"] for p in line]
            ax.step(xs, ys, style, where="post", label=label, color="grey")
        ax.scatter(
            [default["cloud_cost_usd"]],
            [default["slo_attainment"]],
            marker="*",
            s=250,
            color="black",
            zorder=5,
        )
        ax.set(xlabel="cloud spend (USD)", ylabel="SLO attainment")
    spend, slo = default["cloud_cost_usd"], default["slo_attainment"]
    top = max(p["slo_attainment"] for p in frontier["points"])
    axes[1].set(
        xlim=(spend * 0.4, spend * 1.8 + 1e-6),
        ylim=(slo - 0.1, top + 0.01),
        title="around the default (star)",
    )
    axes[0].set(title=title)
    axes[0].legend(fontsize=8)
    return _png(fig, plt)


def _png(fig: Any, plt: Any) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()
