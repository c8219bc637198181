"""A route put through APISIX's Admin API, for the traditional deployment: every node that reads
the same etcd serves it within moments, so one push reaches them all.

The Admin API's key comes from the environment, never from the command line (where every process
of the machine can read it) and never APISIX's documented default keys (anyone can read those).
What APISIX answers is shown with the key, should it appear there, masked.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

# The keys APISIX's own config-default.yaml and documentation carry: an Admin API behind one of
# them is open to anyone who has read them.
DEFAULT_KEYS = frozenset({"edd1c9f034335f136f87ad84b625c8f1", "4054f7cf07e344346cd3f287985e76a2"})
MAX_ANSWER_BYTES = 64 * 1024
TIMEOUT_S = 10.0


class AdminError(RuntimeError):
    """The route was not put: no usable key, a bad Admin API address, or APISIX said no."""


def admin_key(environ: Mapping[str, str], name: str) -> str:
    key = (environ.get(name) or "").strip()
    if not key:
        raise AdminError(
            f"{name} is not set: put the Admin API key (deployment.admin.admin_key in APISIX's "
            f"config.yaml) in the environment variable {name}, or name another with --admin-key-env"
        )
    if key in DEFAULT_KEYS:
        raise AdminError(
            f"{name} holds APISIX's documented default Admin API key, which anyone can read: set a "
            "random key in config.yaml (deployment.admin.admin_key) and in the environment"
        )
    return key


def route_url(admin: str, route_id: str) -> str:
    parts = urlsplit(admin)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        raise AdminError(
            f"--push {admin!r}: name the Admin API's origin alone, http(s)://host:port "
            "(deployment.admin.admin_listen in APISIX's config.yaml)"
        )
    return f"{parts.scheme}://{parts.netloc}/apisix/admin/routes/{quote(route_id, safe='')}"


def put_route(admin: str, route: Mapping[str, Any], environ: Mapping[str, str], key_env: str) -> str:
    """PUT the route; what APISIX answered (its status and the route's key in etcd)."""
    key = admin_key(environ, key_env)
    url = route_url(admin, str(route["id"]))
    body = {k: v for k, v in route.items() if k != "id"}
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="PUT",
        headers={"X-API-KEY": key, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            status, text = answer.status, answer.read(MAX_ANSWER_BYTES).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        text = exc.read(MAX_ANSWER_BYTES).decode(errors="replace").replace(key, "***")
        hint = " (the key in the environment is not the one APISIX has)" if exc.code == 401 else ""
        raise AdminError(f"APISIX's Admin API answered {exc.code}{hint}: {text[:500]}") from None
    except OSError as exc:
        raise AdminError(f"APISIX's Admin API at {url} did not answer: {exc}") from None
    stored = _stored_key(text)
    return f"route {route['id']} put through the Admin API ({status}): {stored}"


def _stored_key(text: str) -> str:
    try:
        return str(json.loads(text).get("key", "stored"))
    except (ValueError, AttributeError):
        return "stored"
