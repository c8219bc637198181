"""Outcomes through a real APISIX's http-logger when clients choose what it copies: a worker
header over its bound, a tenant and a path whose bytes are not UTF-8 (a module of its own: one
APISIX per prefix at a time)."""

from __future__ import annotations

import re

import pytest

from testing.apisix import StackStarter, needs_apisix
from testing.http import wait_until
from testing.standins import StandIns

pytestmark = [pytest.mark.integration, needs_apisix()]

HOSTILE = {"x-spillway-worker": "123456789", "x-tenant": "caf\xe9-" + "t" * 7000}


def test_hostile_fields_cost_only_themselves_and_cloud_failures_still_open_the_breaker(
    stand_ins: StandIns, apisix_stack: StackStarter
) -> None:
    """Every request carries a 9-character X-Spillway-Worker and a 7 KB tenant with a byte that is
    not UTF-8 (nginx passes both as sent, http-logger copies them into its JSON); some also a
    path that decodes to such a byte. aws answers 502: the entries still close the books, so the
    breaker opens (requests then stay local) and nothing stays counted in flight. The worker the
    logger reports is the edge's variable, so the client's header never reaches an entry."""
    front = apisix_stack(stand_ins.config())
    front.set_load(500)
    front.aws.status = 502
    path = "/v2/models/add_sub%FF/infer"
    wait_until(
        lambda: (
            front.decision(front.send("public", path=path, **HOSTILE)) == "local;no_target"
            and front.decision(front.send("public", **HOSTILE)) == "local;no_target"
        ),
        30,
        "aws's failures, reported by http-logger with the client's fields, opening its breaker",
    )
    in_flight = re.compile(r'^spillway_target_in_flight\{target="aws"\} (\S+)$', re.M)
    wait_until(lambda: in_flight.search(front.metrics()) is not None, 10, "the in-flight gauge")
    wait_until(
        lambda: float(in_flight.search(front.metrics()).group(1)) == 0,  # type: ignore[union-attr]
        10,
        "every aws request's books closed",
    )
    counted = re.search(r'spillway_outcome_fields_invalid_total\{field="worker"\} (\S+)', front.metrics())
    assert counted is None or float(counted.group(1)) == 0, "no client's worker header reached an entry"
