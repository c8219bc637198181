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
from collections.abc import Iterable


def target_value(name: str, token: bytes) -> str:
    mac = hmac.new(token, f"spillway-target:{name}".encode(), hashlib.sha256).hexdigest()[:32]
    return f"{name}:{mac}"


def target_values(names: Iterable[str], token: bytes) -> dict[str, str]:
    return {name: target_value(name, token) for name in names}
