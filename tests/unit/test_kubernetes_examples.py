"""The Kubernetes examples README's on-prem section names: the headless Service and Deployment, and
the spillway.yaml section that discovers them, read as the config, the route and APISIX would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import config_snippet

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"


def _local() -> SpillwayConfig:
    local: dict[str, Any] = yaml.safe_load((EXAMPLES / "spillway-local.yaml").read_text())
    return SpillwayConfig.model_validate(local)


def test_the_headless_service_publishes_the_ports_the_discovery_reads() -> None:
    deployment, service = yaml.safe_load_all((EXAMPLES / "onprem-triton.yaml").read_text())
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    dns = _local().local.discovery.dns
    assert dns is not None
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert dns.name == f"{name}.{namespace}.svc.cluster.local"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert (ports["http"], ports["metrics"]) == (dns.port, dns.metrics_port)
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]


def test_the_route_and_apisix_follow_the_same_name() -> None:
    config = _local()
    upstream = route(config, b"t" * 32)["upstream"]
    assert upstream["discovery_type"] == "dns"
    assert upstream["service_name"] == "triton.inference.svc.cluster.local:8000"
    assert "nodes" not in upstream
    assert config_snippet(config)["discovery"] == {"dns": {"servers": ["10.96.0.10:53"]}}
