"""One reading of a request, settled before anything reads it, and what of it may leave.

A request passes through layers that read it each their own way: nginx's ``$http_x_tenant`` takes
the first of ``X-Tenant`` and ``X_Tenant``, APISIX's plugins take the first of repeated headers,
the runner joins them. Where two layers read a header differently, one of them can be talked into
a decision the other would not make. So the headers Spillway reads (the classification header,
the tenant header and those rules name) are read in every spelling (any case, ``_`` or ``-``,
repeated) as one value, and that value is written back as the only spelling, so every later
layer reads what the decision read. Spillway's own headers (``X-Spillway-*``) are never the
client's: every spelling a client sent is removed.

A request that goes to a cloud function carries only the headers inference needs
(``FORWARDED_TO_CLOUD``, plus what a target adds): cookies, API keys and other credentials a
client sent to the gateway never reach a function.

The ``spillway`` Lua plugin (``fast_path/lua/.../spillway/edge.lua``) applies the same rules on the
fast path and on the ext-plugin route before the runner is asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from gateway_plugin.plugin import HttpRequest, RequestAction
from gateway_plugin.policy.model import Policy
from gateway_plugin.policy.tenants import tenant_key
from gateway_plugin.request.header_names import FRAMING, OWN_HEADERS, fold


def read_headers(policy: Policy) -> frozenset[str]:
    """The headers a decision under ``policy`` reads: classification, tenant (unless the consumer
    is), deadline and priority (where read), and what rules name."""
    named = {name for rule in policy.rules for name, _ in rule.headers}
    tenant = () if policy.tenant_from_consumer else (policy.tenant_header,)
    admission = {h for h in (policy.deadline_header, policy.priority_header) if h}
    return frozenset({policy.classification_header, *tenant, *admission, *named})


def forget(request: HttpRequest, name: str, action: RequestAction) -> None:
    """Remove header ``name`` in every spelling the client sent."""
    if name in request.headers:
        for spelling in request.headers.spellings(name):
            action.delete_header(spelling)
        action.delete_header(name)


class Refusal(NamedTuple):
    status: int
    message: str


def settle(
    request: HttpRequest, read: Iterable[str], tenant_header: str, action: RequestAction
) -> Refusal | None:
    """Write back one spelling of every header in ``read`` that came in several (or repeated),
    and remove every spelling of Spillway's own; refuse a tenant named twice differently (which
    of them would the quota count?)."""
    headers = request.headers
    if headers.regular:
        return None
    for name in FRAMING:
        if any("_" in spelling for spelling in headers.spellings(name)):
            return Refusal(
                400, f"an '_' spelling of {name}: nginx frames the body by {name} alone; send that"
            )
    for name in read:
        spellings = headers.spellings(name)
        if not spellings and headers.count(name) < 2:
            continue
        value = headers[name]
        if name == tenant_header:
            distinct = set(request_values(request, name))
            if len(distinct) > 1:
                return Refusal(400, f"{name} sent with {len(distinct)} different values; send it once")
            value = distinct.pop()
        for spelling in spellings:
            action.delete_header(spelling)
        action.set_header(name, value)
    for name in OWN_HEADERS:
        forget(request, name, action)
    return None


def request_values(request: HttpRequest, name: str) -> list[str]:
    """Every value of header ``name`` in any spelling, as sent."""
    return [v or "" for k, v in request.raw_headers if fold(k) == name]


def forward_only(request: HttpRequest, allowed: frozenset[str], action: RequestAction) -> None:
    """Remove every header outside ``allowed`` before the request leaves for a cloud function, and
    every ``_`` spelling even of an allowed one (only the ``-`` spelling is forwarded)."""
    headers = request.headers
    for name in headers:
        if name not in allowed:
            action.delete_header(name)
        if headers.regular:  # every name in one spelling: nothing else to remove
            continue
        for spelling in headers.spellings(name):
            if spelling != name:
                action.delete_header(spelling)


def as_decided(
    headers: Mapping[str, str], policy: Policy, consumer: str | None
) -> tuple[Mapping[str, str], str | None] | None:
    """The headers a decision reads and the tenant (its bounded key). With
    ``policy.tenant_from_consumer`` the tenant is the APISIX consumer that authenticated the
    request, never the header a client sets, and None comes back when no authentication named one
    (the request is refused: trusting the header instead is what the setting exists to prevent). A
    consumer whose data is of a class that may not leave (``policy.consumer_ceilings``) keeps all
    its requests home, whatever their own label says."""
    if policy.tenant_from_consumer and not consumer:
        return None
    tenant = consumer if policy.tenant_from_consumer else headers.get(policy.tenant_header) or None
    changed: dict[str, str] = {}
    if tenant is not None and (policy.tenant_from_consumer or tenant != tenant_key(tenant)):
        tenant = tenant_key(tenant)
        changed[policy.tenant_header] = tenant
    ceiling = policy.consumer_ceilings.get(consumer or "")
    if ceiling is not None and ceiling not in policy.cloud_allowed:
        changed[policy.classification_header] = ceiling
    return ({**headers, **changed} if changed else headers), tenant
