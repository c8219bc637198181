"""The LLM chain the generation tests and ``bench/generate_stream.py`` run: an on-prem tritonserver,
the function it spills to (the FC server with its own sidecar), and a real APISIX with both routes
between them, all serving the ``tokens`` test model on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from functions.sidecar import Sidecar, SidecarOptions, free_port
from testing.apisix import both_routes, gateway_for, metrics_url
from testing.function import function_server, model_repository

MODEL = "tokens"
# A request carrying this header (value "yes") is sent to the function whatever the load says.
SPILL = "x-test-spill"


TOKENS_ONLY = {"usd_per_request": 0, "usd_per_gb_second": 0, "usd_per_gpu_second": 0}
USD_PER_TOKEN = 0.001
# Each prompt token (the request body's bytes / costs.BYTES_PER_INPUT_TOKEN), none expected at decision.
USD_PER_PROMPT_TOKEN = 0.0001
# The function's price: per token alone, so a stream's spend says how many it sent and was sent.
FUNCTION_COST = {
    **TOKENS_ONLY,
    "usd_per_output_token": USD_PER_TOKEN,
    "expected_output_tokens": 4,
    "usd_per_input_token": USD_PER_PROMPT_TOKEN,
}


def chain_config(
    triton_url: str,
    metrics_url: str,
    function_url: str,
    cap: int,
    tenants: dict[str, Any] | None = None,
    **local: Any,
) -> dict[str, Any]:
    """Spillway's config: the tritonserver as the cluster (the vLLM engine's thresholds read from
    its metrics; ``local`` adds settings), the function as target ``aws`` (at most ``cap`` in
    flight), the rule that spills a request marked ``SPILL``, and the ``tenants`` settings."""
    return {
        **({"tenants": tenants} if tenants is not None else {}),
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
                "cost": FUNCTION_COST,
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


@dataclass(frozen=True)
class RunningChain:
    triton_url: str
    function_url: str
    gateway_url: str
    metrics_url: str  # the runner's
    onprem_model: Path  # the on-prem model's directory (its hold and kv_cache files)
    cloud_model: Path  # the function's
    config: dict[str, Any]  # Spillway's


@contextmanager
def running_chain(
    work: Path,
    key: str,
    cap: int,
    home: Path | None = None,
    triton_log: Path | None = None,
    tenants: dict[str, Any] | None = None,
    **local: Any,
) -> Iterator[RunningChain]:
    """The chain started in ``work`` (``key``: the function's signing key; ``home``: APISIX's prefix,
    by default the shared install; ``tenants``: the config's; ``local``: settings added to the
    config's ``local``)."""
    onprem, cloud = work / "onprem", work / "cloud"
    onprem.mkdir()
    cloud.mkdir()
    onprem, cloud = model_repository(onprem, MODEL), model_repository(cloud, MODEL)
    metrics_port = free_port()
    logging: dict[str, Any] = {"log_path": triton_log} if triton_log else {"log_prefix": ""}
    with ExitStack() as running:
        triton = Sidecar(SidecarOptions(onprem, (MODEL,), 60, metrics_port=metrics_port, **logging))
        triton.start()
        running.callback(triton.stop)
        triton.wait_ready(60)
        function = running.enter_context(
            function_server(
                cloud,
                work,
                SPILLWAY_MODELS=MODEL,
                SPILLWAY_SIGNING_KEY=key,
                SPILLWAY_ALLOW_UNSIGNED_PAYLOAD="1",
            )
        )
        triton_url = f"http://127.0.0.1:{triton.http_port}"
        config = chain_config(
            triton_url, f"http://127.0.0.1:{metrics_port}/metrics", function.url, cap, tenants, **local
        )
        where = {"home": home} if home is not None else {}
        gateway = running.enter_context(
            gateway_for(config, work, both_routes(config), fast_path=True, signing_key=key, **where)
        )
        yield RunningChain(
            triton_url, function.url, gateway.url, metrics_url(config), onprem / MODEL, cloud / MODEL, config
        )
