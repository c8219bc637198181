"""``runner:``, ``outcomes:`` and ``metrics:``: how the runner meets APISIX and operators."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from gateway_plugin.config.model import Model

PluginSpec = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"),
]


class RunnerSettings(Model):
    conf_ttl_s: float | None = Field(
        default=None,
        gt=0,
        description="how long a prepared conf lives, in s; unset: 2 x APISIX_CONF_EXPIRE_TIME",
    )
    socket: str | None = Field(default=None, description="socket path when APISIX_LISTEN_ADDRESS is unset")
    uvloop: bool = Field(default=True, description="run on uvloop where installed")
    route_token_env: str = Field(
        default="SPILLWAY_ROUTE_TOKEN",
        description="environment variable holding the route token that makes cloud X-Spillway-Target "
        "values unforgeable (required when a target is in upstream mode)",
    )
    socket_group: str | None = Field(
        default=None,
        description="group that may use the socket (0660) when APISIX's workers run as another user; "
        "default: the runner's user only (0600)",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="runner processes accepting on the one socket (more than one needs shared_state)",
    )
    plugins: list[PluginSpec] = Field(
        default_factory=list,
        max_length=64,
        description="more plugins for this runner, each 'module:Class' naming a subclass of "
        "gateway_plugin.plugin.Plugin importable by the runner's Python; a route's ext-plugin conf "
        "names them as it names spillway and headers (a change needs a restart)",
    )


class OutcomeSettings(Model):
    """Where the route's ``http-logger`` posts what happened to each request."""

    listen: str | None = Field(
        default="127.0.0.1:9092",
        description="host:port of the runner's outcome endpoint (POST /spillway/outcomes); null: none",
    )
    batch_s: int = Field(
        default=1,
        ge=1,
        le=60,
        description="the logger's buffer_duration and inactive_timeout: outcomes arrive this late at most",
    )


# APISIX's own prometheus plugin exports on 127.0.0.1:9091 by default, and its control API and
# Prometheus itself listen on 9090: the runner's metrics keep clear of both.
METRICS_LISTEN = "127.0.0.1:9095"


class MetricsSettings(Model):
    listen: str | None = Field(
        default=METRICS_LISTEN,
        description="host:port of the runner's /metrics (worker i of several: port + i); keep it off "
        "APISIX's prometheus exporter (127.0.0.1:9091 by default)",
    )
    decision_header: bool = Field(default=True, description="add X-Spillway-Decision to answers")
    tenant_series: int = Field(
        default=20,
        ge=0,
        le=1000,
        description="tenants with their own cost series (the first to reach the top by spend); the "
        'rest are counted as tenant="other"',
    )
    model_series: int = Field(
        default=20,
        ge=0,
        le=1000,
        description="models with their own cost series (among those the cluster reports or the config "
        'names, the first to reach the top by spend); the rest are model="other"',
    )
