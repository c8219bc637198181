"""A request's deadline, from its headers: how long it will wait, and whether a late answer is
worth anything to it.

When what cannot leave fills the cluster, a request queued past its deadline both misses and
delays every request behind it. So a request that the cluster cannot answer in time, and that
goes nowhere else, is refused at once (503, Retry-After) rather than queued. A client names its
deadline in seconds (``admission.deadline_header``) and its priority (``critical`` or
``sheddable``, as the Gateway API Inference Extension's criticality does); a sheddable request
without a deadline takes its model's latency target as one (a late answer is worth nothing to
it), so as the cluster fills the sheddable requests are refused first. A critical request without
one keeps the ceilings it always had (``max_queue_ms``, ``saturation_ratio``).

``apisix/plugins/spillway/admission.lua`` reads the same headers the same way.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway_plugin.policy.model import Policy
    from gateway_plugin.policy.snapshot import RequestFeatures

# Seconds: digits, with up to three decimals (milliseconds), surrounding whitespace ignored.
DEADLINE_SYNTAX = r"[0-9]{1,6}(?:\.[0-9]{1,3})?"
_DEADLINE = re.compile(DEADLINE_SYNTAX)
CRITICAL, SHEDDABLE = "critical", "sheddable"


class InvalidAdmission(ValueError):
    """A deadline or priority header that says neither (``invalid_message`` says what they hold)."""


def invalid_message(policy: Policy) -> str:
    """What a 400 for a bad deadline or priority says, on both routes."""
    return (
        f"{policy.deadline_header or '-'}: seconds to wait (digits, up to 3 decimals); "
        f"{policy.priority_header or '-'}: {CRITICAL} or {SHEDDABLE}"
    )


def deadline_ms(features: RequestFeatures, policy: Policy, target_ms: float) -> float | None:
    """The request's deadline in ms (at most ``max_deadline_ms``), or None: it has none."""
    sheddable = policy.default_sheddable
    if policy.priority_header:
        named = features.headers.get(policy.priority_header)
        if named is not None:
            priority = named.strip().lower()
            if priority not in (CRITICAL, SHEDDABLE):
                raise InvalidAdmission(policy.priority_header)
            sheddable = priority == SHEDDABLE
    if policy.deadline_header:
        given = features.headers.get(policy.deadline_header)
        if given is not None:
            seconds = given.strip()
            if not _DEADLINE.fullmatch(seconds):
                raise InvalidAdmission(policy.deadline_header)
            return min(float(seconds) * 1000, policy.max_deadline_ms)
    return target_ms if sheddable else None
