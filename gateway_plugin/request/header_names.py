"""The header names Spillway reads, sets and lets leave, in the one spelling it reads them.

nginx reads ``X_Tenant`` as ``X-Tenant`` (``$http_x_tenant`` takes either), so Spillway does too:
a name is compared folded (lower case, ``-`` for ``_``). ``X-Spillway-*`` names are Spillway's
own: a client's are removed. What a cloud function may receive is an allow-list, closed by default.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from functions.contract import HEADER_SIGNATURE, HEADER_TARGET

OWN_PREFIX = "x-spillway-"
# Which runner worker decided a request, where several share the socket: its outcome goes back there.
HEADER_WORKER = "x-spillway-worker"
# The tenant a decision counted, handed by the runner to the route's edge for the outcome's report.
HEADER_TENANT = "x-spillway-tenant"
# The APISIX consumer that authenticated a request, handed by the route's edge to the runner.
HEADER_CONSUMER = "x-spillway-consumer"
# Set by Spillway alone (the runner or the plugin); a client's spelling of any is removed.
OWN_HEADERS = (HEADER_TARGET, HEADER_SIGNATURE, HEADER_WORKER, HEADER_TENANT, HEADER_CONSUMER)
# nginx frames a request body by these in their "-" spelling alone: an "_" spelling is refused, so
# that no layer reads a size nginx does not.
FRAMING = ("content-length", "transfer-encoding")
# What inference needs (KServe v2, JSON or binary tensors, compressed or not) and Spillway's
# signature; ``host`` is the upstream's own (APISIX sets it from the node).
FORWARDED_TO_CLOUD = frozenset(
    {
        "host",
        "content-type",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "accept",
        "accept-encoding",
        "inference-header-content-length",
        HEADER_SIGNATURE,
        HEADER_TARGET,
    }
)
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}")


def fold(name: str) -> str:
    """The one spelling of a header name: lower case, ``-`` for ``_``."""
    return name.lower().replace("_", "-")


def _header_name(name: str) -> str:
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{name!r} is not a header name (letters, digits and !#$%&'*+.^_`|~- only)")
    folded = fold(name)
    if folded.startswith(OWN_PREFIX):
        raise ValueError(f"{name!r}: X-Spillway-* headers are Spillway's own; clients' are removed")
    return folded


# A header name in spillway.yaml, stored folded.
HeaderName = Annotated[str, AfterValidator(_header_name)]
