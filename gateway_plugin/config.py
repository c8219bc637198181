"""``spillway.yaml``: validated once at start; a bad field is named by its path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class ConfigError(ValueError):
    """The config file cannot be used; the message names the file and the bad fields."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunnerSettings(_Model):
    conf_ttl_s: float | None = Field(
        default=None,
        gt=0,
        description="how long a prepared conf lives; default 1.2 x APISIX_CONF_EXPIRE_TIME",
    )
    socket: str | None = Field(default=None, description="socket path when APISIX_LISTEN_ADDRESS is unset")
    uvloop: bool = Field(default=True, description="run on uvloop where installed")


class DevGatewaySettings(_Model):
    """The development stand-in for APISIX: one route, upstreams picked as traffic-split picks them."""

    listen: str = Field(default="127.0.0.1:9080", description="host:port to serve HTTP on")
    upstreams: dict[str, str] = Field(
        default_factory=lambda: {"local": "http://127.0.0.1:8000"},
        description="upstream name → http://host:port; X-Spillway-Target picks one",
    )
    default_upstream: str = Field(default="local", description="the route's own upstream")
    plugins: list[tuple[str, dict[str, Any]]] = Field(
        default_factory=lambda: [("headers", dict[str, Any]())],
        description="the route's ext-plugin-pre-req conf, in order",
    )
    post_resp: bool = Field(default=True, description="also call the runner after the upstream answers")
    allow_degradation: bool = Field(default=False, description="pass requests through when the runner fails")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)

    @field_validator("upstreams")
    @classmethod
    def _urls(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if not url.startswith("http://"):
                raise ValueError(f"upstream {name!r}: {url!r} must be an http:// URL")
        return value


class SpillwayConfig(_Model):
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    devgateway: DevGatewaySettings = Field(default_factory=DevGatewaySettings)


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse(data: Any, source: str = "config") -> SpillwayConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    try:
        return SpillwayConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {_where(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(lines)) from None


def load(path: Path | str) -> SpillwayConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse(data, str(path))
