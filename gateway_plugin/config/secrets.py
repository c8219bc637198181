"""What the gateway keeps secret: read from the variables the config names, once per config, at
the edge (the runner's app, its workers, the CLI), and handed in.

The route token (the MAC key of cloud targets' values and the outcome endpoint's auth) and each
target's signing key never sit in the file; nothing that decides or keeps books reads the
environment itself, and no value read here is ever printed (``repr`` leaves them out).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway_plugin.config import ConfigError, SpillwayConfig, Target

MIN_TOKEN_LEN = 16


class RouteTokenError(ValueError):
    """The route token is missing or too weak to keep clients from picking a cloud target."""


def signing_key(target: Target, environ: Mapping[str, str]) -> bytes | None:
    """None when the target's variable is unset or empty (then its function must not require a
    signature); one holding only blanks is a key nobody meant, refused."""
    name = target.signing_key_env
    raw = environ.get(name, "") if name else ""
    if raw and not raw.strip():
        raise ConfigError(
            f"target {target.name!r}: {name} holds a blank signing key; set a random key of 32 bytes "
            "or more, or unset it if the function requires no signature"
        )
    return raw.encode() if raw else None


@dataclass(frozen=True)
class GatewaySecrets:
    """``route_token`` is None when its variable is unset or too short, and ``route_token_problem``
    then says which and what to do; ``signing_keys``: target name to key, where one is set."""

    route_token: bytes | None = field(default=None, repr=False)
    route_token_problem: str = "no route token was read"
    signing_keys: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}), repr=False)

    @classmethod
    def read(cls, config: SpillwayConfig, environ: Mapping[str, str] | None = None) -> GatewaySecrets:
        """Raises ``ConfigError`` for a target whose key variable holds only blanks."""
        env = os.environ if environ is None else environ
        name = config.runner.route_token_env
        raw = env.get(name, "").strip()
        keys = {t.name: key for t in config.targets if (key := signing_key(t, env)) is not None}
        if len(raw) >= MIN_TOKEN_LEN:
            return cls(raw.encode(), "", MappingProxyType(keys))
        problem = (
            f"{name} must hold a random route token of at least {MIN_TOKEN_LEN} characters "
            f"({'it is not set' if not raw else 'it is too short'}); it keeps clients from choosing a "
            "cloud target. Generate one with: python -c 'import secrets; print(secrets.token_hex(32))', "
            "give it to the runner and run 'python -m gateway_plugin traffic-split' for the route's rules"
        )
        return cls(None, problem, MappingProxyType(keys))

    def require_route_token(self) -> bytes:
        if self.route_token is None:
            raise RouteTokenError(self.route_token_problem)
        return self.route_token
