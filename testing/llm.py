"""The LLM chain the generation tests and ``bench/generate_stream.py`` run: an on-prem tritonserver,
the function it spills to, and the config that routes between them through both APISIX routes."""

from __future__ import annotations

from typing import Any

from functions.sidecar import free_port

# A request carrying this header (value "yes") is sent to the function whatever the load says.
SPILL = "x-test-spill"


def chain_config(
    triton_url: str, metrics_url: str, function_url: str, cap: int, **local: Any
) -> dict[str, Any]:
    """Spillway's config: the tritonserver as the cluster (the vLLM engine's thresholds read from
    its metrics; ``local`` adds settings), the function as target ``aws`` (at most ``cap`` in
    flight), and the rule that spills a request marked ``SPILL``."""
    return {
        "local": {
            "endpoints": [{"url": triton_url, "metrics_url": metrics_url}],
            "latency_target_ms": 5000,
            "thresholds": {"engine": {"backend": "vllm"}},
            "scrape_period_s": 0.2,
            **local,
        },
        "targets": [
            {
                "name": "aws",
                "kind": "http",
                "url": function_url,
                "signing_key_env": "SPILLWAY_SIGNING_KEY",
                "cold_start_ms": 0,
                "concurrency_cap": cap,
            }
        ],
        "rules": [
            {
                "name": "spill",
                "priority": 10,
                "match": {"headers": {SPILL: "yes"}},
                "action": "target",
                "targets": ["aws"],
            }
        ],
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
    }
