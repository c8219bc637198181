"""What the demo shows: a live table, the checks, and an HTML report with inline SVG charts."""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from devtools.loadgen import Sample

COLORS = {"local": "#2b6cb0", "aws": "#dd6b20", "aliyun": "#805ad5", "shed": "#c53030", "unknown": "#718096"}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def live_table(samples: list[Sample], elapsed_s: float) -> str:
    rows = defaultdict(list)
    cold: dict[str, int] = defaultdict(int)
    for sample in list(samples):
        if sample.status:
            rows[sample.target].append(sample.latency_s * 1000)
            cold[sample.target] += sample.cold
    lines = [f"t={elapsed_s:5.1f}s  {'target':<8} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'cold':>5}"]
    for target in sorted(rows):
        lat = rows[target]
        lines.append(
            f"          {target:<8} {len(lat):>8} {_pct(lat, 0.5):>8.1f} {_pct(lat, 0.99):>8.1f} "
            f"{cold[target]:>5}"
        )
    return "\n".join(lines)


def runner_metrics(url: str) -> dict[str, dict[str, float]]:
    """Spend, warm instances and decisions by target, from the runner's own endpoint."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    try:
        text = requests.get(url, timeout=5).text
    except requests.RequestException:
        return {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            target = sample.labels.get("target")
            if target is None:
                continue
            if sample.name == "spillway_cloud_spend_usd_total":
                out["spend_usd"][target] = sample.value
            elif sample.name == "spillway_warm_instances":
                out["warm_instances"][target] = sample.value
            elif sample.name == "spillway_decisions_total":
                out["decisions"][target] = out["decisions"].get(target, 0) + sample.value
    return dict(out)


def sensitive_lines_in_cloud(result: dict[str, Any]) -> int:
    """Count, from the function instances' own access logs, requests labelled confidential."""
    found = 0
    for folder in result["instance_logs"].values():
        for log in Path(folder).glob("*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("{") and '"event": "request"' in line:
                    entry = json.loads(line)
                    found += (entry.get("headers") or {}).get("x-data-classification") == "confidential"
    return found


def cloud_requests_in_logs(result: dict[str, Any]) -> int:
    total = 0
    for folder in result["instance_logs"].values():
        for log in Path(folder).glob("*.log"):
            total += sum(
                1
                for line in log.read_text(errors="replace").splitlines()
                if line.startswith("{") and '"path": "/v2/models/' in line
            )
    return total


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
            "p50_ms": round(_pct(lat, 0.5), 1),
            "p99_ms": round(_pct(lat, 0.99), 1),
            "cold_hits": sum(r["cold"] for r in rows),
            "sensitive": sum(r["sensitive"] for r in rows),
        }
    # The cluster's own answer time, as the gateway measured it (APISIX's $upstream_response_time):
    # what the latency target is about; the client's time adds the gateway's hops on a shared machine.
    local = [r["upstream_ms"] for r in by_target.get("local", []) if r["upstream_ms"] is not None]
    local_burst = [
        r["upstream_ms"]
        for r in by_target.get("local", [])
        if r["upstream_ms"] is not None and r["phase"] == "burst"
    ]
    cold_hits = sum(r["cold"] for r in samples)
    cold_bound = sum(max(0, s["pool_max"] - s["warm_instances"]) for _ in ("aws", "aliyun"))
    errors = [r for r in samples if not r["status"]]
    sensitive_out = sensitive_lines_in_cloud(result)
    checks = {
        "every_request_answered_once": result["sent"] == result["answered"] == len(samples) and not errors,
        "no_sensitive_request_in_cloud_logs": sensitive_out == 0,
        "local_p99_within_target": _pct(local, 0.99) <= s["latency_target_ms"],
        "cold_hits_within_warmup_bound": cold_hits <= cold_bound,
    }
    return {
        "requests": len(samples),
        "targets": targets,
        "errors": len(errors),
        "local_p99_ms": round(_pct(local, 0.99), 1),
        "local_burst_p99_ms": round(_pct(local_burst, 0.99), 1),
        "latency_target_ms": s["latency_target_ms"],
        "cold_hits": cold_hits,
        "cold_hit_bound": cold_bound,
        "sensitive_requests_in_cloud_logs": sensitive_out,
        "cloud_requests_in_logs": cloud_requests_in_logs(result),
        "spend_usd": result["runner_metrics"].get("spend_usd", {}),
        "checks": checks,
        "ok": all(checks.values()),
    }


def _svg_latency(samples: list[dict[str, Any]], width: int = 760, height: int = 260) -> str:
    if not samples:
        return ""
    end = max(x["sent_at"] for x in samples) or 1.0
    top = max(_pct([x["latency_s"] * 1000 for x in samples], 0.995), 1.0)
    dots = []
    for x in samples:
        cx = 40 + (width - 60) * x["sent_at"] / end
        cy = height - 30 - (height - 50) * min(x["latency_s"] * 1000, top) / top
        color = COLORS.get(x["target"], COLORS["unknown"])
        ring = ' stroke="#000" stroke-width="1.5"' if x["cold"] else ""
        dots.append(
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{3.5 if x["cold"] else 1.8}" fill="{color}"{ring}/>'
        )
    axes = (
        f'<line x1="40" y1="{height - 30}" x2="{width - 20}" y2="{height - 30}" stroke="#999"/>'
        f'<line x1="40" y1="20" x2="40" y2="{height - 30}" stroke="#999"/>'
        f'<text x="44" y="16" font-size="11">{top:.0f} ms</text>'
        f'<text x="{width - 90}" y="{height - 12}" font-size="11">{end:.0f} s</text>'
    )
    return f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">{axes}{"".join(dots)}</svg>'


def _svg_split(samples: list[dict[str, Any]], width: int = 760, height: int = 200) -> str:
    buckets: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for x in samples:
        buckets[int(x["sent_at"])][x["target"]] += 1
    if not buckets:
        return ""
    seconds = max(buckets) + 1
    peak = max(sum(b.values()) for b in buckets.values())
    bar = (width - 60) / seconds
    rects = []
    for second in range(seconds):
        y = float(height - 30)
        for target, count in sorted(buckets[second].items()):
            h = (height - 50) * count / peak
            y -= h
            rects.append(
                f'<rect x="{40 + second * bar:.1f}" y="{y:.1f}" width="{bar * 0.9:.1f}" height="{h:.1f}" '
                f'fill="{COLORS.get(target, COLORS["unknown"])}"/>'
            )
    return (
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
        f'<text x="44" y="16" font-size="11">{peak} requests/s</text>{"".join(rects)}</svg>'
    )


def report_html(result: dict[str, Any], summary: dict[str, Any]) -> str:
    legend = " ".join(
        f'<span style="color:{c}">&#9632; {html.escape(t)}</span>'
        for t, c in COLORS.items()
        if t in summary["targets"]
    )
    rows = "".join(
        f"<tr><td>{html.escape(t)}</td><td>{v['requests']}</td><td>{v['p50_ms']}</td><td>{v['p99_ms']}</td>"
        f"<td>{v['cold_hits']}</td><td>{v['sensitive']}</td>"
        f"<td>{summary['spend_usd'].get(t, 0.0):.6f}</td></tr>"
        for t, v in summary["targets"].items()
    )
    checks = "".join(
        f"<li>{'&#10004;' if ok else '&#10008;'} {html.escape(name.replace('_', ' '))}</li>"
        for name, ok in summary["checks"].items()
    )
    style = (
        "body{font-family:sans-serif;max-width:820px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
    )
    header = (
        "<tr><th>target</th><th>requests</th><th>p50 ms</th><th>p99 ms</th><th>cold hits</th>"
        "<th>confidential</th><th>est. spend USD</th></tr>"
    )
    intro = (
        f"{summary['requests']} requests in three phases (steady, burst, after); "
        f"{result['settings']['sensitive_share']:.0%} labelled confidential. On-prem latency target "
        f"{summary['latency_target_ms']:g} ms; local p99 {summary['local_p99_ms']} ms "
        f"(during the burst {summary['local_burst_p99_ms']} ms)."
    )
    tail = (
        f"Cold hits: {summary['cold_hits']} (bound promised by the warm-up: {summary['cold_hit_bound']}). "
        f"Function instances logged {summary['cloud_requests_in_logs']} inference requests, of which "
        f"{summary['sensitive_requests_in_cloud_logs']} confidential."
    )
    return "\n".join(
        [
            '<!doctype html><html><head><meta charset="utf-8"><title>Spillway demo report</title>',
            f"<style>{style}</style></head><body><h1>Spillway demo</h1><p>{intro}</p>",
            f"<h2>Checks</h2><ul>{checks}</ul>",
            f"<h2>Per target</h2><table>{header}{rows}</table>",
            f"<h2>Latency over time</h2><p>{legend}; ringed dots were answered by a cold instance.</p>",
            _svg_latency(result["samples"]),
            f"<h2>Traffic split per second</h2>{_svg_split(result['samples'])}<p>{tail}</p></body></html>",
        ]
    )
