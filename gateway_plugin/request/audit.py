"""The audit trail: one line per request on a Spillway route, written by one of APISIX's own
loggers (file-logger, http-logger, kafka-logger), so where it goes and how long it is kept is the
log system's.

Both routes put the decision in the request's context, where the logger's ``log_format`` reads it
through variables the Lua plugins register (``spillway/edge.lua``): the fast path's ``spillway``
plugin from its own decision; on the ext-plugin route the runner sends ``X-Spillway-Audit`` with
its answer (``audit_header``), which the ``spillway-edge`` plugin takes into the context and
removes before the client sees it. A line holds who asked (the tenant as the books key it), what
was asked (the model, the data's class), what was decided and why, and what it was estimated to
cost; never a header's value but those, a body, the target's MAC'd value, a signature or a key.
Every text in it is bounded: names a client chose are keyed as tenants are (``policy.tenants``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from gateway_plugin.config import AuditSettings
from gateway_plugin.policy.model import LOCAL, SHED, Decision
from gateway_plugin.policy.tenants import tenant_key

HEADER_AUDIT = "X-Spillway-Audit"
# X-Spillway-Audit's fields, in order, joined by SEP; the edge registers each (and ``via``) as an
# APISIX variable named VAR_PREFIX + field.
FIELDS = ("decision", "target", "reason", "tenant", "class", "model", "cost")
SEP = ";"
VAR_PREFIX = "spillway_"
# Which route decided: ``via``'s values.
VIA_FAST_PATH, VIA_EXT_PLUGIN = "fast_path", "ext_plugin"
# The ``log_format`` of the audit logger: field → nginx or APISIX variable.
LOG_FORMAT = {
    "time": "$time_iso8601",
    "request_id": "$request_id",
    "route_id": "$route_id",
    "via": f"${VAR_PREFIX}via",
    "tenant": f"${VAR_PREFIX}tenant",
    "classification": f"${VAR_PREFIX}class",
    "model": f"${VAR_PREFIX}model",
    "decision": f"${VAR_PREFIX}decision",
    "target": f"${VAR_PREFIX}target",
    "reason": f"${VAR_PREFIX}reason",
    "cost_usd": f"${VAR_PREFIX}cost",
    "status": "$status",
    "upstream_status": "$upstream_status",
    "request_s": "$request_time",
}
# What ``decision`` says: where the request went, or that it was answered at the edge.
CLOUD, REFUSED = "cloud", "refused"


def kind(target: str) -> str:
    """``local``, ``shed`` or ``cloud``."""
    return target if target in (LOCAL, SHED) else CLOUD


def audit_header(decision: Decision, model: str | None, classification: str | None) -> str:
    """``X-Spillway-Audit`` for the edge: the decision's fields, each percent-encoded, joined by
    ``;`` (decision, target, reason, tenant, class, model, cost), every text bounded. Most requests
    repeat a few combinations: those made last are kept (at most ``_MADE_MAX``)."""
    key = (decision.target, decision.label, decision.tenant, classification, model, decision.cost_usd)
    made = _made.get(key)
    if made is None:
        fields = (
            kind(decision.target),
            decision.target,
            decision.label,
            decision.tenant or "",
            _bounded(classification),
            _bounded(model),
            f"{decision.cost_usd:.10g}",
        )
        if len(_made) >= _MADE_MAX:
            _made.clear()
        made = _made[key] = SEP.join(quote(f, safe="") for f in fields)
    return made


_MADE_MAX = 4096
_made: dict[tuple[str, str, str | None, str | None, str | None, float], str] = {}


def refused_header(status: int) -> str:
    """The header for a request answered before any decision (400, 401)."""
    return SEP.join((REFUSED, "", str(status), "", "", "", "0"))


def _bounded(text: str | None) -> str:
    return "" if text is None else tenant_key(text)


def logger_conf(settings: AuditSettings) -> dict[str, Any]:
    """The logger's conf on a route: the operator's settings and Spillway's log format."""
    return {**settings.conf, "log_format": dict(LOG_FORMAT)}
