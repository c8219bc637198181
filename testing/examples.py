"""The shipped examples on loopback: ``examples/spillway.yaml`` and the APISIX routes made from it
name private-range hosts, which no test may send traffic to; these move them onto the stand-ins a
test starts on 127.0.0.1."""

from __future__ import annotations

import json
from typing import Any

import yaml

from functions.sidecar import free_port
from testing.paths import ROOT

# What the example APISIX config passes through to the runner (nginx_config.envs).
EXAMPLE_ENVS = [
    "SPILLWAY_ROUTE_TOKEN",
    "SPILLWAY_SIGNING_KEY",
    "AWS_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "ALIBABA_CLOUD_ACCESS_KEY_ID",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
]


def example_config(local: str, aws: str, metrics_url: str, outcomes: str) -> dict[str, Any]:
    """examples/spillway.yaml with its private-range hosts moved to loopback stand-ins."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "spillway.yaml").read_text())
    config["local"]["endpoints"] = [{"url": local, "metrics_url": metrics_url}]
    config["local"]["scrape_period_s"] = 0.1
    config["local"]["stale_after_s"] = 1.0
    config["targets"][0]["url"] = aws
    config["targets"][0]["cold_start_ms"] = 0
    config["metrics"]["listen"] = f"127.0.0.1:{free_port()}"
    config["outcomes"]["listen"] = outcomes
    return config


def loopback_route(route: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """An example route with the same hosts moved (upstream nodes, the logger's endpoint)."""
    text = json.dumps(route)
    for old, new in (
        ("10.0.0.11:8000", config["local"]["endpoints"][0]["url"].removeprefix("http://")),
        ("10.0.0.12:8000", config["local"]["endpoints"][0]["url"].removeprefix("http://")),
        ("http://127.0.0.1:9092", f"http://{config['outcomes']['listen']}"),
    ):
        text = text.replace(old, new)
    moved: dict[str, Any] = json.loads(text)
    rules = moved["plugins"].get("traffic-split", {}).get("rules", [])
    cloud = [weighted["upstream"] for rule in rules for weighted in rule["weighted_upstreams"]]
    cloud += moved["plugins"].get("spillway", {}).get("upstreams", {}).values()
    for up in cloud:
        up["scheme"] = "http"
        up["nodes"] = {config["targets"][0]["url"].removeprefix("http://"): 1}
    if "aws-lambda" in moved["plugins"]:
        moved["plugins"]["aws-lambda"]["function_uri"] = config["targets"][0]["url"] + "/v2"
    return moved
