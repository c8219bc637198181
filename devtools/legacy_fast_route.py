"""The fast route as made before the ``spillway`` plugin set the upstream itself, which the plugin
still serves: the tests check that it does, and ``bench/apisix_gateway.py`` measures it beside the
current layout (cases ``fast-local-split``, ``fast-cloud-split``)."""

from __future__ import annotations

from typing import Any

from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route


def split_fast_route(
    config: SpillwayConfig, token: bytes, route_id: str = "spillway-fast", uri: str = "/v2/*"
) -> dict[str, Any]:
    """No ``upstreams`` in the plugin's conf; traffic-split, as on the ext-plugin route, picks the
    upstream by the target's value the plugin sets."""
    made = fast_route(config, token, route_id, uri)
    del made["plugins"]["spillway"]["upstreams"]
    made["plugins"]["traffic-split"] = route(config, token, route_id, uri)["plugins"]["traffic-split"]
    return made
