"""What the demo shows when it is over: the summary and its checks, and a self-contained HTML report.

The report's charts are drawn with matplotlib and embedded as PNG data, so ``report.html`` is one
file that opens anywhere.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from devtools.demo_monitoring import dashboards_html

COLORS = {"local": "#2b6cb0", "aws": "#dd6b20", "aliyun": "#805ad5", "shed": "#c53030", "unknown": "#718096"}
CLOUD_TARGETS = ("aws", "aliyun")
# A steady phase keeps at least this share of its requests on premises.
STEADY_LOCAL_SHARE = 0.95
TIME_AXIS = "time since the load started (s)"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _request_log_entries(result: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for folder in result["instance_logs"].values():
        for log in Path(folder).glob("*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("{") and '"event": "request"' in line:
                    yield json.loads(line)


def sensitive_lines_in_cloud(result: dict[str, Any]) -> int:
    """Count, from the function instances' own access logs, requests labelled confidential."""
    return sum(
        (e.get("headers") or {}).get("x-data-classification") == "confidential"
        for e in _request_log_entries(result)
    )


def cloud_requests_in_logs(result: dict[str, Any]) -> int:
    return sum(str(e.get("path", "")).startswith("/v2/models/") for e in _request_log_entries(result))


def phases_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The load's phases: name, start and end (seconds from the start of the load), rate."""
    return list(result["phases"])


def phase_summary(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per phase: where its requests were decided to go, and how long they took."""
    out = {}
    for phase in phases_of(result):
        rows = [r for r in result["samples"] if r["phase"] == phase["name"]]
        n = len(rows) or 1
        local = [r for r in rows if r["target"] == "local"]
        cloud = [r for r in rows if r["target"] in CLOUD_TARGETS]
        upstream = [r["upstream_ms"] for r in local if r["upstream_ms"] is not None]
        latency = [r["latency_s"] * 1000 for r in rows]
        out[phase["name"]] = {
            "rate_per_s": phase["rate_per_s"],
            "requests": len(rows),
            "local_share": round(len(local) / n, 3),
            "cloud_share": round(len(cloud) / n, 3),
            "shed": sum(r["target"] == "shed" for r in rows),
            "p50_ms": round(percentile(latency, 0.5), 1),
            "p99_ms": round(percentile(latency, 0.99), 1),
            "local_p99_ms": round(percentile(upstream, 0.99), 1),
            "cold_hits": sum(r["cold"] for r in rows),
        }
    return out


# How late the runner can know the cluster drained: one outcome batch after the last local answer
# of the burst (the development gateway's logger posts every 0.2 s, APISIX's http-logger every
# outcomes.batch_s, at least 1 s). Results name their gateway and its interval; older ones: dev.
FEEDBACK_S = {"dev": 0.2, "apisix": 1.0}


def gateway_of(result: dict[str, Any]) -> dict[str, Any]:
    """Which gateway ran (name, label) and how late the runner heard of answers (feedback_s)."""
    gateway = {"name": "dev", "label": "the development gateway (a stand-in for APISIX)"}
    gateway.update(result.get("gateway") or {})
    return {"feedback_s": FEEDBACK_S.get(gateway["name"], 1.0), **gateway}


def after_burst(result: dict[str, Any]) -> dict[str, float]:
    """The way back after the burst, in seconds from its end: when the cluster had answered the
    last request the burst left it (its backlog drained), when the last request went to the cloud,
    and the share of requests sent once the runner could know of the drain that stayed on premises."""
    burst = next((p for p in phases_of(result) if p["name"] == "burst"), None)
    if burst is None:
        return {"backlog_drained_s": 0.0, "last_cloud_s": 0.0, "local_share_once_drained": 1.0}
    end, samples = burst["end_s"], result["samples"]
    drained = max(
        (x["sent_at"] + x["latency_s"] for x in samples if x["target"] == "local" and x["sent_at"] < end),
        default=end,
    )
    later = [x for x in samples if x["sent_at"] >= max(drained + gateway_of(result)["feedback_s"], end)]
    last_cloud = max((x["sent_at"] for x in samples if x["target"] in CLOUD_TARGETS), default=end)
    return {
        "backlog_drained_s": round(max(0.0, drained - end), 2),
        "last_cloud_s": round(max(0.0, last_cloud - end), 2),
        "local_share_once_drained": round(
            sum(x["target"] == "local" for x in later) / len(later) if later else 1.0, 3
        ),
    }


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    s = result["settings"]
    samples = result["samples"]
    by_target: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sample in samples:
        by_target[sample["target"] or "unknown"].append(sample)
    targets = {}
    for target, rows in sorted(by_target.items()):
        lat = [r["latency_s"] * 1000 for r in rows]
        targets[target] = {
            "requests": len(rows),
            "p50_ms": round(percentile(lat, 0.5), 1),
            "p99_ms": round(percentile(lat, 0.99), 1),
            "cold_hits": sum(r["cold"] for r in rows),
            "sensitive": sum(r["sensitive"] for r in rows),
        }
    # The cluster's own answer time, as the gateway measured it (APISIX's $upstream_response_time):
    # what the latency target is about; the client's time adds the gateway's hops on a shared machine.
    local = [r["upstream_ms"] for r in by_target.get("local", []) if r["upstream_ms"] is not None]
    phases = phase_summary(result)
    cold_hits = sum(r["cold"] for r in samples)
    cold_bound = sum(max(0, s["pool_max"] - s["warm_instances"]) for _ in CLOUD_TARGETS)
    errors = [r for r in samples if not r["status"]]
    sensitive_out = sensitive_lines_in_cloud(result)
    cloud = sum(v["requests"] for t, v in targets.items() if t in CLOUD_TARGETS)
    checks = {
        "every_request_answered_once": result["sent"] == result["answered"] == len(samples) and not errors,
        "no_sensitive_request_in_cloud_logs": sensitive_out == 0,
        "local_p99_within_target": bool(local) and percentile(local, 0.99) <= s["latency_target_ms"],
        "cold_hits_within_warmup_bound": cold_hits <= cold_bound,
        # The load before the burst, half the local capacity, stays on premises. The phase after
        # it is reported, not checked: it starts on the burst's backlog, and the runner's way back
        # to local after a burst is slower than the cluster's (see ``after_burst``).
        "steady_phase_stays_local": phases.get("steady", {}).get("local_share", 1.0) >= STEADY_LOCAL_SHARE,
    }
    return {
        "gateway": gateway_of(result),
        "requests": len(samples),
        "targets": targets,
        "phases": phases,
        "cloud_share": round(cloud / (len(samples) or 1), 3),
        "after_burst": after_burst(result),
        "errors": len(errors),
        "local_p99_ms": round(percentile(local, 0.99), 1),
        "local_burst_p99_ms": phases.get("burst", {}).get("local_p99_ms", 0.0),
        "latency_target_ms": s["latency_target_ms"],
        "cold_hits": cold_hits,
        "cold_hit_bound": cold_bound,
        "sensitive_requests_in_cloud_logs": sensitive_out,
        "cloud_requests_in_logs": cloud_requests_in_logs(result),
        "spend_usd": result["runner_metrics"].get("spend_usd", {}),
        "checks": checks,
        # The guarantees decide the exit status; latency, cold hits and shares depend on the
        # machine's load and are reported.
        "ok": checks["every_request_answered_once"] and checks["no_sensitive_request_in_cloud_logs"],
    }


def _axes(height: float = 3.4) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(10, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.grid(True, color="#e2e8f0", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def _finish(
    ax: Axes,
    xlabel: str,
    ylabel: str,
    legend: Literal["upper right", "upper left"] = "upper right",
    columns: int = 1,
) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the data
    ax.legend(loc=legend, fontsize=8, ncols=columns, framealpha=0.9)


def _mark_phases(ax: Axes, phases: list[dict[str, Any]]) -> None:
    """Shade the burst, draw each boundary and name each phase along the top."""
    for phase in phases:
        if phase["name"] == "burst":
            ax.axvspan(phase["start_s"], phase["end_s"], color="#fed7d7", alpha=0.45, linewidth=0)
        if phase["start_s"] > 0:
            ax.axvline(phase["start_s"], color="#4a5568", linestyle=":", linewidth=1)
        ax.text(
            (phase["start_s"] + phase["end_s"]) / 2,
            1.01,
            f"{phase['name']} ({phase['rate_per_s']:g}/s)",
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=9,
            color="#2d3748",
        )
    ax.set_xlim(0, max((p["end_s"] for p in phases), default=1.0) + 0.5)


def _targets_in(samples: list[dict[str, Any]]) -> list[str]:
    seen = {x["target"] or "unknown" for x in samples}
    return [t for t in COLORS if t in seen] + sorted(seen - set(COLORS))


def _dots(ax: Axes, rows: list[dict[str, Any]], **style: Any) -> None:
    ax.scatter([x["sent_at"] for x in rows], [x["latency_s"] * 1000 for x in rows], **style)


def chart_latency(result: dict[str, Any]) -> Figure:
    samples, phases = result["samples"], phases_of(result)
    fig, ax = _axes(3.4)
    _mark_phases(ax, phases)
    for target in _targets_in(samples):
        rows = [x for x in samples if (x["target"] or "unknown") == target]
        color = COLORS.get(target, COLORS["unknown"])
        _dots(ax, rows, s=9, color=color, label=f"{target} ({len(rows)})", alpha=0.8, linewidths=0)
    cold = [x for x in samples if x["cold"]]
    if cold:
        _dots(ax, cold, s=60, facecolors="none", edgecolors="#000000", label=f"cold instance ({len(cold)})")
    ax.axhline(
        result["settings"]["latency_target_ms"],
        color="#c53030",
        linestyle="--",
        linewidth=1,
        label="on-prem latency target",
    )
    _finish(ax, TIME_AXIS, "latency seen by the client (ms)", columns=3)
    return fig


def chart_split(result: dict[str, Any]) -> Figure:
    samples, phases = result["samples"], phases_of(result)
    fig, ax = _axes(3.0)
    _mark_phases(ax, phases)
    seconds = int(max((p["end_s"] for p in phases), default=0.0)) + 1
    bottom = [0] * seconds
    for target in _targets_in(samples):
        counts = [0] * seconds
        for x in samples:
            if (x["target"] or "unknown") == target:
                counts[min(seconds - 1, int(x["sent_at"]))] += 1
        color = COLORS.get(target, COLORS["unknown"])
        ax.bar([x + 0.5 for x in range(seconds)], counts, 0.9, bottom, color=color, label=target)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _finish(ax, TIME_AXIS, "requests sent per second")
    return fig


def chart_cold(result: dict[str, Any], summary: dict[str, Any]) -> Figure:
    phases = [p["name"] for p in phases_of(result)]
    fig, ax = _axes(2.8)
    width = 0.8 / len(CLOUD_TARGETS)
    for i, target in enumerate(CLOUD_TARGETS):
        rows = [x for x in result["samples"] if x["target"] == target]
        warm = [sum(1 for x in rows if x["phase"] == p and not x["cold"]) for p in phases]
        cold = [sum(1 for x in rows if x["phase"] == p and x["cold"]) for p in phases]
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(phases))]
        color = COLORS[target]
        ax.bar(xs, warm, width * 0.95, color=color, label=f"{target}: warm instance")
        ax.bar(
            xs,
            cold,
            width * 0.95,
            bottom=warm,
            color="#ffffff",
            edgecolor=color,
            hatch="///",
            label=f"{target}: cold instance ({sum(cold)})",
        )
    ax.set_xticks(range(len(phases)), phases)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(
        f"cold hits: {summary['cold_hits']} (the warm-up's bound: {summary['cold_hit_bound']})",
        fontsize=10,
    )
    _finish(ax, "phase", "cloud requests")
    return fig


def chart_cost(result: dict[str, Any], summary: dict[str, Any]) -> Figure:
    """Cumulative estimated spend per cloud target: the runner's estimate, spread over its requests."""
    fig, ax = _axes(2.8)
    phases = phases_of(result)
    _mark_phases(ax, phases)
    end = max((p["end_s"] for p in phases), default=0.0)
    for target in CLOUD_TARGETS:
        times = sorted(x["sent_at"] for x in result["samples"] if x["target"] == target)
        spend = float(summary["spend_usd"].get(target, 0.0))
        each = spend / len(times) if times else 0.0
        steps = [each * i for i in range(len(times) + 1)]
        ax.step(
            [0.0, *times, end],
            [*steps, spend],
            where="post",
            color=COLORS[target],
            label=f"{target}: ${spend:.6f}",
        )
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:.6f}"))
    _finish(ax, TIME_AXIS, "estimated spend (USD)", "upper left")
    return fig


_CHARTS = {
    "latency": (
        "Latency over time per target",
        "Each dot is a request; ringed: answered by a cold instance.",
    ),
    "split": ("Traffic split over time", "Where each second's requests were sent."),
    "cold": ("Cold hits", "Cloud requests per phase, by a warm or a cold instance."),
    "cost": ("Estimated cost", "The runner's spend estimate, cumulative per target."),
}


def charts(result: dict[str, Any], summary: dict[str, Any]) -> list[tuple[str, str, str, Figure]]:
    """The report's charts: an id, a title, a caption and the figure."""
    figures = {
        "latency": chart_latency(result),
        "split": chart_split(result),
        "cold": chart_cold(result, summary),
        "cost": chart_cost(result, summary),
    }
    return [(key, *_CHARTS[key], fig) for key, fig in figures.items()]


def png_data_uri(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


_STYLE = (
    "body{font-family:sans-serif;max-width:960px;margin:1.5em auto;color:#1a202c}"
    "table{border-collapse:collapse;margin:0.5em 0}"
    "td,th{border:1px solid #cbd5e0;padding:3px 8px;text-align:right}td:first-child{text-align:left}"
    "figure{margin:1em 0}figure img{width:100%;height:auto;display:block}"
    "figcaption{font-size:0.9em;color:#4a5568}.ok{color:#276749}.fail{color:#c53030}"
)
# Marks each chart once the page has loaded (and says so on the page when one cannot be shown).
_SCRIPT = """<script>
window.addEventListener("load", function () {
  document.querySelectorAll("img.chart").forEach(function (img) {
    var ok = img.complete && img.naturalWidth > 0, r = img.getBoundingClientRect();
    img.dataset.loaded = ok ? "1" : "0";
    img.dataset.natural = img.naturalWidth + "x" + img.naturalHeight;
    img.dataset.box = [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height]
      .map(Math.round).join(",");
    if (!ok) img.insertAdjacentText("afterend", "(this chart could not be shown)");
  });
});
</script>"""


_PHASE_ROW = "{rate_per_s:g}|{requests}|{local_share:.1%}|{cloud_share:.1%}|{p50_ms}|{p99_ms}|"
_PHASE_ROW += "{local_p99_ms}|{cold_hits}"
_TARGET_ROW = "{requests}|{p50_ms}|{p99_ms}|{cold_hits}|{sensitive}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def report_html(result: dict[str, Any], summary: dict[str, Any]) -> str:
    phases = _table(
        ["phase", "rate /s", "requests", "local", "cloud", "p50 ms", "p99 ms", "cluster p99 ms", "cold hits"],
        [[html.escape(n), *_PHASE_ROW.format(**p).split("|")] for n, p in summary["phases"].items()],
    )
    spend = summary["spend_usd"]
    targets = _table(
        ["target", "requests", "p50 ms", "p99 ms", "cold hits", "confidential", "est. spend USD"],
        [
            [html.escape(t), *_TARGET_ROW.format(**v).split("|"), f"{spend.get(t, 0.0):.6f}"]
            for t, v in summary["targets"].items()
        ],
    )
    checks = "".join(
        f"<li class='{'ok' if ok else 'fail'}'>{'&#10004;' if ok else '&#10008;'} "
        f"{html.escape(name.replace('_', ' '))}</li>"
        for name, ok in summary["checks"].items()
    )
    back = summary["after_burst"]
    intro = (
        f"Gateway: {html.escape(summary['gateway']['label'])}. "
        f"{summary['requests']} requests in {len(summary['phases'])} phases; "
        f"{result['settings']['sensitive_share']:.0%} labelled confidential. On-prem latency target "
        f"{summary['latency_target_ms']:g} ms; the cluster's p99 {summary['local_p99_ms']} ms "
        f"(during the burst {summary['local_burst_p99_ms']} ms). "
        f"{summary['cloud_share']:.1%} of all requests went to the cloud."
    )
    recovery = (
        f"After the burst, the cluster had answered its backlog in {back['backlog_drained_s']:g} s; "
        f"the last request went to the cloud {back['last_cloud_s']:g} s after the burst; of the requests "
        f"sent once the backlog was answered and the gateway had reported it (after "
        f"{summary['gateway']['feedback_s']:g} s), {back['local_share_once_drained']:.1%} stayed on premises."
    )
    tail = (
        f"Cold hits: {summary['cold_hits']} (bound promised by the warm-up: {summary['cold_hit_bound']}). "
        f"Function instances logged {summary['cloud_requests_in_logs']} inference requests, of which "
        f"{summary['sensitive_requests_in_cloud_logs']} confidential."
    )
    figures = "".join(
        f'<h2>{html.escape(title)}</h2><figure><img class="chart" id="chart-{key}" '
        f'alt="{html.escape(title)}" src="{png_data_uri(fig)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for key, title, caption, fig in charts(result, summary)
    )
    return "\n".join(
        [
            '<!doctype html><html><head><meta charset="utf-8"><title>Spillway demo report</title>',
            f"<style>{_STYLE}</style></head><body><h1>Spillway demo</h1><p>{intro}</p>",
            f"<h2>Checks</h2><ul>{checks}</ul>",
            f"<h2>Per phase</h2>{phases}",
            "<p>local and cloud: the share of the phase's requests the gateway decided to keep or send "
            f"out; cluster p99: the on-prem answer time the gateway measured. {recovery}</p>",
            f"<h2>Per target</h2>{targets}",
            figures,
            dashboards_html(result),
            f"<p>{tail}</p>{_SCRIPT}</body></html>",
        ]
    )
