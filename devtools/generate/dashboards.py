"""Spillway's Grafana dashboards, written as JSON into ``ops/grafana/dashboards`` from the panels
below (``python -m devtools.generate``); a test requires the files to be what this makes.

Every panel names its unit, draws its thresholds where one means something, and names each series
in its legend; its queries go to the dashboard's ``datasource`` variable, and ``$__rate_interval``
is Grafana's (a test runs every query against a real Prometheus with it set to a fixed window).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[2] / "ops" / "grafana" / "dashboards"
RATE = "[$__rate_interval]"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
CLOUD = 'target!~"local|shed"'
# The warm-up's pings, per target: every runner shows the warm-up's same counter, so once per
# target (the highest copy), never summed across runners.
WARMUP_RATE = f"max by (target) (rate(spillway_warmup_spend_usd_total{RATE}))"
# All of it, and 0 rather than nothing when no warm-up runs, so a sum with it still shows.
WARMUP_TOTAL = f"(sum({WARMUP_RATE}) or vector(0))"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    kind: str = "timeseries"
    thresholds: tuple[tuple[str, float], ...] = ()  # (color, from value), above the base green
    description: str = ""
    mappings: tuple[tuple[str, str, str], ...] = ()  # (value, text, color)
    width: int = 12


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def _rate(metric: str, by: str = "", where: str = "") -> str:
    selector = f"{metric}{{{where}}}" if where else metric
    grouped = f"sum by ({by}) " if by else "sum"
    return f"{grouped}(rate({selector}{RATE}))"


GATEWAY = Dashboard(
    "spillway-gateway",
    "Spillway: gateway",
    "Where requests go and why, the cluster's wait against its target, and what limits overflow.",
    (
        Panel(
            "Decisions by target and reason",
            "reqps",
            ((_rate("spillway_decisions_total", "target, reason"), "{{target}} {{reason}}"),),
        ),
        Panel(
            "Spill share (to cloud targets)",
            "percentunit",
            (
                (
                    f"{_rate('spillway_decisions_total', where=CLOUD)} / {_rate('spillway_decisions_total')}",
                    "spill share",
                ),
            ),
            "stat",
            (("yellow", 0.3), ("red", 0.5)),
            "The SpillwaySpillShareHigh alert fires past 50 % for 15 minutes.",
            width=6,
        ),
        Panel(
            "Gateway answers (APISIX) by status",
            "reqps",
            (("sum by (code) (rate(apisix_http_status" + RATE + "))", "{{code}}"),),
            description="APISIX's own prometheus plugin (apisix-route --prometheus).",
            width=6,
        ),
        Panel(
            "Local wait against the latency target, per model",
            "s",
            (
                ("max by (model) (spillway_local_wait_seconds)", "wait {{model}}"),
                ("max by (model) (spillway_latency_target_seconds)", "target {{model}}"),
            ),
            description="Model * is every model together and the default target.",
        ),
        Panel(
            "On-prem members",
            "none",
            (
                ("sum by (state) (spillway_local_members)", "{{state}}"),
                ('max(spillway_local_capacity{model="*"})', "capacity (requests at once)"),
            ),
            description="Members whose metrics answer (up), failing within local.drop_member_after_s, "
            "dropped from the capacity (down), and answering metrics while failing inference (wedged, "
            "not counted), summed over runners; and the capacity the policy counts.",
        ),
        Panel(
            "Breakers",
            "none",
            (
                ("max by (target) (spillway_breaker_open)", "{{target}}"),
                ("max by (model) (spillway_local_failing)", "on-prem {{model}}"),
            ),
            "stat",
            (("red", 1),),
            mappings=(("0", "closed", "green"), ("1", "open", "red")),
            width=6,
        ),
        Panel(
            "Concurrency cap in use",
            "percentunit",
            (
                (
                    "sum by (target) (spillway_target_in_flight)"
                    " / sum by (target) (spillway_target_concurrency_cap)",
                    "{{target}}",
                ),
            ),
            "bargauge",
            (("yellow", 0.8), ("red", 1.0)),
            width=6,
        ),
        Panel(
            "Spend against each budget",
            "percentunit",
            (
                (
                    "max by (target, window) (spillway_target_spent_usd)"
                    " / max by (target, window) (spillway_budget_usd)",
                    "{{target}} per {{window}}",
                ),
            ),
            "bargauge",
            (("yellow", 0.8), ("red", 1.0)),
            "At 100 % a target takes no overflow until its window ends.",
        ),
        Panel(
            "Fast path: decision table age (p99) and fail-safe decisions",
            "s",
            (
                (
                    "histogram_quantile(0.99, sum by (le) (rate(spillway_fast_path_table_age_seconds_bucket"
                    + RATE
                    + ")))",
                    "table age p99",
                ),
            ),
            thresholds=(("red", 0.5),),
            description="Tables are fetched every 50 ms; past stale_after_s (1 s) every decision fails safe.",
        ),
        Panel(
            "Fast path: fail-safe decisions",
            "reqps",
            ((_rate("spillway_fast_path_fail_safe_total"), "fail-safe"),),
            thresholds=(("red", 0.001),),
            width=6,
        ),
        Panel(
            "Triton signals fresh / shared state connected",
            "none",
            (
                ("min by (instance) (spillway_signals_fresh)", "signals {{instance}}"),
                ("min by (instance) (spillway_shared_state_connected)", "shared state {{instance}}"),
            ),
            "stat",
            mappings=(("0", "no", "red"), ("1", "yes", "green")),
            description="Shared state reads 0 on a runner without a shared_state section.",
            width=6,
        ),
        *(
            Panel(
                f"On-prem {what} (local.thresholds)",
                "percentunit",
                (
                    (f'max(spillway_local_threshold_value{{threshold="{name}"}})', shown),
                    (f'max(spillway_local_threshold_limit{{threshold="{name}"}})', "spills above"),
                ),
                description=f"{source}, as the runner scraped it; public traffic spills above the "
                "limit. Drawn where local.thresholds names it (or load_aware's alias).",
                width=6,
            )
            for name, what, shown, source in (
                (
                    "gpu_utilization",
                    "GPU utilisation",
                    "busiest GPU",
                    "nv_gpu_utilization of the busiest GPU",
                ),
                (
                    "gpu_memory",
                    "GPU memory in use",
                    "fullest GPU",
                    "nv_gpu_memory_used_bytes / nv_gpu_memory_total_bytes of the fullest GPU",
                ),
            )
        ),
    ),
)

FUNCTIONS = Dashboard(
    "spillway-functions",
    "Spillway: functions",
    "The cloud functions as they report themselves (/spillway/metrics), per scrape job.",
    (
        Panel(
            "Requests by status",
            "reqps",
            ((_rate("spillway_function_requests_total", "job, code"), "{{job}} {{code}}"),),
        ),
        Panel(
            "Inference latency (p50, p99)",
            "s",
            tuple(
                (
                    f"histogram_quantile({q}, sum by (job, le) (rate("
                    f'spillway_function_request_seconds_bucket{{kind="infer"}}{RATE})))',
                    f"{{{{job}}}} p{round(q * 100)}",
                )
                for q in (0.5, 0.99)
            ),
        ),
        Panel(
            "Streams: tokens per second",
            "short",
            ((_rate("spillway_function_stream_events_total", "job"), "{{job}}"),),
            description="generate_stream's events relayed by the function, one per token.",
            width=6,
        ),
        Panel(
            "Streams: time to first token (p50, p99)",
            "s",
            tuple(
                (
                    f"histogram_quantile({q}, sum by (job, le) (rate("
                    f"spillway_function_stream_first_event_seconds_bucket{RATE})))",
                    f"{{{{job}}}} p{round(q * 100)}",
                )
                for q in (0.5, 0.99)
            ),
            description="From a stream's request at the function to its first event relayed.",
            width=6,
        ),
        Panel(
            "Triton queue and compute time per inference",
            "s",
            tuple(
                (
                    f"sum by (job, model) (rate(spillway_function_triton_{part}_seconds_total{RATE})) / "
                    f"sum by (job, model) (rate(spillway_function_triton_inferences_total{RATE}))",
                    f"{part} {{{{job}}}} {{{{model}}}}",
                )
                for part in ("queue", "compute")
            ),
        ),
        Panel(
            "4xx and 5xx share",
            "percentunit",
            tuple(
                (
                    f'(sum by (job) (rate(spillway_function_requests_total{{code=~"{c}.."}}{RATE})) or '
                    f"sum by (job) (rate(spillway_function_requests_total{RATE})) * 0) / "
                    f"sum by (job) (rate(spillway_function_requests_total{RATE}))",
                    f"{c}xx {{{{job}}}}",
                )
                for c in (4, 5)
            ),
            thresholds=(("red", 0.05),),
            description="The SpillwayFunctionErrors alert fires past 5 % of 5xx for 5 minutes.",
        ),
        Panel(
            "Cold starts",
            "short",
            ((f"sum by (job) (increase(spillway_function_cold_starts_total{RATE}))", "{{job}}"),),
            width=8,
        ),
        Panel(
            "Sidecar restarts (last hour)",
            "short",
            (("sum by (job) (increase(spillway_function_sidecar_restarts_total[1h]))", "{{job}}"),),
            "stat",
            (("yellow", 1), ("red", 3)),
            width=8,
        ),
        Panel(
            "Start-up: process start to sidecar ready",
            "s",
            (("max by (job) (spillway_function_init_seconds)", "{{job}}"),),
            "stat",
            (("yellow", 5), ("red", 9)),
            "Lambda allows 10 s of init.",
            width=8,
        ),
    ),
)

WARMUP = Dashboard(
    "spillway-warmup",
    "Spillway: warm-up",
    "Whether the warm-up keeps the instances it promises warm, and what cold starts still happen.",
    (
        Panel(
            "Verified warm instances against planned",
            "short",
            (
                ("max by (target) (spillway_warmup_warm_instances)", "verified {{target}}"),
                ("max by (target) (spillway_warmup_wanted_instances)", "planned {{target}}"),
                ("max by (target) (spillway_warm_instances)", "seen warm {{target}}"),
            ),
        ),
        Panel(
            "Cold hits",
            "short",
            ((f"sum by (target) (increase(spillway_cold_hits_total{RATE}))", "{{target}}"),),
            width=6,
        ),
        Panel(
            "Cold-hit share of cloud requests",
            "percentunit",
            (
                (
                    f"sum by (target) (rate(spillway_cold_hits_total{RATE})) / "
                    f"sum by (target) (rate(spillway_decisions_total{{{CLOUD}}}{RATE}))",
                    "{{target}}",
                ),
            ),
            "stat",
            (("yellow", 0.01), ("red", 0.05)),
            width=6,
        ),
        Panel(
            "Since the last warm-up round",
            "s",
            (("time() - max(spillway_warmup_last_round_timestamp_seconds)", "last round"),),
            "stat",
            (("yellow", 300), ("red", 600)),
            "Rounds run every warmup.interval_s (240 s by default).",
            width=6,
        ),
    ),
)

COST = Dashboard(
    "spillway-cost",
    "Spillway: cost",
    "Estimated spend per target, tenant and model, and local against cloud cost per 1,000 requests. "
    "Cloud spend is the requests' and the warm-up's pings' (spillway_warmup_spend_usd_total, the "
    "same in every runner: taken once per target).",
    (
        Panel(
            "Cloud spend per target",
            "currencyUSD",
            (
                (
                    f"(sum by (target) (rate(spillway_cloud_spend_usd_total{RATE})) + on (target) "
                    f"{WARMUP_RATE} or sum by (target) (rate(spillway_cloud_spend_usd_total{RATE})) "
                    f"or {WARMUP_RATE}) * 3600",
                    "{{target}} per hour",
                ),
            ),
            description="The requests sent there and the warm-up's pings.",
        ),
        Panel(
            "Cost per 1,000 requests: local and cloud",
            "currencyUSD",
            (
                (
                    f"1000 * sum(rate(spillway_local_cost_usd_total{RATE})) / "
                    f'sum(rate(spillway_requests_total{{target="local"}}{RATE}))',
                    "local",
                ),
                (
                    f'1000 * (sum(rate(spillway_spend_usd_total{{target!="local"}}{RATE})) + '
                    f"{WARMUP_TOTAL}) / "
                    f'sum(rate(spillway_requests_total{{target!="local"}}{RATE}))',
                    "cloud",
                ),
            ),
            description="Local: what the cluster's GPUs cost (local.cost) over the requests it served. "
            "Cloud: the requests' spend and the warm-up's pings over the requests sent out.",
        ),
        Panel(
            "Cloud spend per tenant",
            "currencyUSD",
            (
                (f"sum by (tenant) (rate(spillway_spend_usd_total{RATE})) * 3600", "{{tenant}} per hour"),
                (f"sum({WARMUP_RATE}) * 3600", "warm-up (no tenant) per hour"),
            ),
            width=8,
        ),
        Panel(
            "Cloud spend per model",
            "currencyUSD",
            (
                (f"sum by (model) (rate(spillway_spend_usd_total{RATE})) * 3600", "{{model}} per hour"),
                (f"sum({WARMUP_RATE}) * 3600", "warm-up (no model) per hour"),
            ),
            width=8,
        ),
        Panel(
            "Requests per tenant and target",
            "reqps",
            ((_rate("spillway_requests_total", "tenant, target"), "{{tenant}} {{target}}"),),
            width=8,
        ),
        Panel(
            "On-prem cluster cost",
            "currencyUSD",
            (("max(spillway_local_cost_usd_per_hour)", "per hour"),),
            "stat",
            width=6,
        ),
        Panel(
            "Spent in the last 24 hours",
            "currencyUSD",
            (
                (
                    "sum(increase(spillway_spend_usd_total[1d])) + "
                    "(sum(max by (target) (increase(spillway_warmup_spend_usd_total[1d]))) or vector(0))",
                    "cloud",
                ),
                ("sum(increase(spillway_local_cost_usd_total[1d]))", "on-prem"),
            ),
            "stat",
            description="Cloud: the requests' spend and the warm-up's pings.",
            width=6,
        ),
        Panel(
            "Warm-up spend per target",
            "currencyUSD",
            ((f"{WARMUP_RATE} * 3600", "{{target}} per hour"),),
            description="The warm-up's pings (python -m warmup; not pings sent by cloud schedulers), "
            "part of the cloud spend above, once per target however many runners show it.",
            width=12,
        ),
    ),
)

DASHBOARDS = (GATEWAY, FUNCTIONS, WARMUP, COST)


def _thresholds(panel: Panel) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": value} for color, value in panel.thresholds]
    return {"mode": "absolute", "steps": steps}


def _panel(panel: Panel, number: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit, "thresholds": _thresholds(panel)}
    if panel.kind == "timeseries":
        style = "line" if panel.thresholds else "off"
        defaults["custom"] = {"thresholdsStyle": {"mode": style}, "lineWidth": 1, "fillOpacity": 10}
    if panel.mappings:
        defaults["mappings"] = [
            {"type": "value", "options": {value: {"text": text, "color": color}}}
            for value, text, color in panel.mappings
        ]
    options: dict[str, Any] = {"legend": {"showLegend": True, "displayMode": "table", "placement": "bottom"}}
    if panel.kind != "timeseries":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return {
        "id": number,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(panel.queries)
        ],
    }


def render(dashboard: Dashboard) -> dict[str, Any]:
    panels, x, y = [], 0, 0
    for number, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y = 0, y + 8
        panels.append(_panel(panel, number, x, y))
        x += panel.width
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["spillway"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                }
            ]
        },
        "panels": panels,
    }


def files() -> dict[Path, str]:
    """Each dashboard's file and its JSON."""
    return {OUT / f"{d.uid}.json": json.dumps(render(d), indent=2) + "\n" for d in DASHBOARDS}
