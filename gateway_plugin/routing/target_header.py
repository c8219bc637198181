"""The values of a decision's target: what APISIX's ``traffic-split`` matches to pick an upstream.

traffic-split matches the ``spillway_upstream`` variable, which only Spillway's Lua plugins set (on
the ext-plugin route, from the runner's ``X-Spillway-Target``, after the client's spellings of it
were removed). A cloud target's value also carries a MAC of its name under a per-deployment route
token, which the runner and the routes share and clients never see (``aws:3f0c…``), so a route
written by hand to match the header instead still takes no client's guess. ``local`` needs none:
it is where a request goes anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable

MIN_TOKEN_LEN = 16


class RouteTokenError(ValueError):
    """The route token is missing or too weak to keep clients from picking a cloud target."""


def route_token(env_name: str, environ: dict[str, str] | None = None) -> bytes:
    raw = (os.environ if environ is None else environ).get(env_name, "").strip()
    if len(raw) < MIN_TOKEN_LEN:
        raise RouteTokenError(
            f"{env_name} must hold a random route token of at least {MIN_TOKEN_LEN} characters "
            f"({'it is not set' if not raw else 'it is too short'}); it keeps clients from choosing a "
            "cloud target. Generate one with: python -c 'import secrets; print(secrets.token_hex(32))', "
            "give it to the runner and run 'python -m gateway_plugin traffic-split' for the route's rules"
        )
    return raw.encode()


def target_value(name: str, token: bytes) -> str:
    mac = hmac.new(token, f"spillway-target:{name}".encode(), hashlib.sha256).hexdigest()[:32]
    return f"{name}:{mac}"


def target_values(names: Iterable[str], token: bytes) -> dict[str, str]:
    return {name: target_value(name, token) for name in names}
