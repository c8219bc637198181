"""One policy, two executions: Python's ``decide()`` and the ``spillway`` Lua plugin's, on the real
APISIX, agree on every random case (config, route overrides, snapshot, request), and no case a
residency rule keeps home is given a cloud target by the Lua side.

The cases go through a test-only plugin (``tests/lua/apisix/plugins/spillway-cases.lua``) that runs
the plugin's own modules on each: the table as the runner encodes it, parsed and compiled by the
plugin; the route's overrides; the request's features; the decision. Thousands of cases per request
keep CI time sane. Not covered: invoke mode (the fast path serves upstream-mode targets only) and
the plugin's reservation of cap, budget and probe (counted in the shared dict, exercised on the
route by ``test_apisix_fast_path``).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import apisix
from functions.sidecar import free_port
from gateway_plugin.apisix_fast_route import lua_path
from gateway_plugin.routing import decision_table
from gateway_plugin.routing.policy import LOCAL, SHED, Reason, RequestFeatures, may_leave
from gateway_plugin.routing.spillway import RouteOverrides, _route_policy
from tests.apisix_support import needs_apisix
from tests.fast_path_cases import Group, expected, python_decision, random_group
from tests.support import ROOT, http

pytestmark = [pytest.mark.integration, needs_apisix()]

SEED = 20261201
GROUPS, PER_GROUP, PER_BATCH = 400, 48, 50  # 19,200 cases in eight requests


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[apisix.Apisix]:
    route = {
        "id": "cases",
        "uri": "/spillway-cases",
        "plugins": {"spillway-cases": {}},
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1": 1}},
    }
    settings = apisix.ApisixSettings(
        port=free_port(),
        routes_yaml=json.dumps({"routes": [route]}),
        plugins=["spillway-cases"],
        extra_lua_path=lua_path(),
        more_lua_paths=[ROOT / "tests" / "lua"],
    )
    with apisix.running(settings) as running:
        yield running


def _lua(gateway: apisix.Apisix, groups: list[Group]) -> list[dict[str, object]]:
    body = json.dumps([{"table": g.table, "cases": g.cases} for g in groups]).encode()
    status, _, answer = http(
        "POST", gateway.url + "/spillway-cases", body, {"content-type": "application/json"}
    )
    assert status == 200, answer[:500]
    decoded: list[dict[str, object]] = json.loads(answer)
    return decoded


def _leaves_allowed(group: Group, case: dict[str, object]) -> bool:
    route = RouteOverrides.model_validate(case["route"])
    headers = {k: ", ".join(v) if isinstance(v, list) else v for k, v in case["headers"].items()}  # type: ignore[union-attr]
    return may_leave(RequestFeatures("/", headers), _route_policy(group.policy, route))


def test_python_and_lua_decide_every_case_alike_and_keep_residency(gateway: apisix.Apisix) -> None:
    rng = random.Random(SEED)
    groups = [random_group(rng, PER_GROUP) for _ in range(GROUPS)]
    checked, cloud, kept, refused = 0, 0, 0, 0
    labels: set[str] = set()
    mismatches: list[str] = []
    for start in range(0, len(groups), PER_BATCH):
        batch = groups[start : start + PER_BATCH]
        for group, answer in zip(batch, _lua(gateway, batch), strict=True):
            assert "error" not in answer, f"the plugin refused a table the runner made: {answer}"
            for case, got in zip(group.cases, answer["results"], strict=True):  # type: ignore[call-overload]
                want = expected(group, case)
                checked += 1
                if "cost_usd" in got:
                    got["cost_usd"] = float(got["cost_usd"])
                if got != want:
                    mismatches.append(f"{json.dumps(case)}\n  python {want}\n  lua    {got}")
                if "refused" in got:
                    refused += 1
                    continue
                if got["target"] not in (LOCAL, SHED):
                    cloud += 1
                    assert _leaves_allowed(group, case), f"Lua sent an on-prem-only request out: {case}"
                kept += bool(got["residency_kept"])
                labels.add(str(got["label"]).partition(":")[0])
    assert not mismatches, f"{len(mismatches)} of {checked} differ; first:\n" + "\n".join(mismatches[:5])
    assert checked >= 10_000
    # The cases reach every branch that matters: some go out, some are kept home by residency.
    assert cloud > 500 and kept > 500 and refused > 500, (cloud, kept, refused)
    every = {r.value for r in Reason} - {Reason.INVOKE_FAILED.value}
    assert every | {"rule", "residency+local_saturated", "no_target+local_saturated"} <= labels, labels
    own, headroom = _moved_by_the_load_estimate(groups)
    assert own > 300 and headroom > 100, (own, headroom)


def _moved_by_the_load_estimate(groups: list[Group]) -> tuple[int, int]:
    """How many cases decide otherwise without the gateway's own in-flight count, and without the
    on-prem-only headroom: the cases reach both, so the Lua side is checked on them."""
    own = headroom = 0
    for group in groups:
        uncounted = group.snapshot._replace(
            local={k: v._replace(in_flight=-1) for k, v in group.snapshot.local.items()}
        )
        no_headroom = dataclasses.replace(group.policy, onprem_headroom=0.0)
        for case in group.cases:
            if "refused" in expected(group, case):
                continue
            d = python_decision(case, case["route"], group.policy, group.snapshot)
            for other, moved in ((uncounted, "own"), (None, "headroom")):
                if other is None:
                    e = python_decision(case, case["route"], no_headroom, group.snapshot)
                else:
                    e = python_decision(case, case["route"], group.policy, other)
                if (e.target, e.label, e.overflowing) != (d.target, d.label, d.overflowing):
                    own, headroom = (own + 1, headroom) if moved == "own" else (own, headroom + 1)
    return own, headroom


def test_the_plugin_lives_where_apisix_lua_path_says() -> None:
    assert (lua_path() / "apisix" / "plugins" / "spillway.lua").is_file()
    assert Path(lua_path()).is_relative_to(ROOT / "gateway_plugin")


def _broken(table: str, old: str, new: str) -> str:
    assert old in table, old
    return table.replace(old, new, 1)


def test_the_plugin_refuses_a_malformed_table_and_says_why(gateway: apisix.Apisix) -> None:
    """What the fetching worker checks before storing a table; a refused one leaves the last good
    table in place (ageing towards stale, tested on the route in test_apisix_fast_path)."""
    group = random_group(random.Random(SEED), 1)
    good = group.table
    first_target = next(iter(group.policy.targets))
    bad = {
        "not JSON": "{",
        "another format": _broken(good, f'"format":{decision_table.FORMAT}', '"format":1'),
        "no policy": _broken(good, '"policy":', '"policie":'),
        "a pattern PCRE cannot compile": _broken(
            good,
            '"rules":[',
            '"rules":[{"name":"x","action":"local","targets":[],"headers":[],"args":[],"models":[],"uri":"(unclosed"},',
        ),
        "an unknown action": _broken(
            good,
            '"rules":[',
            '"rules":[{"name":"x","action":"cloud","targets":[],"headers":[],"args":[],"models":[]},',
        ),
        "a NaN latency": _broken(good, '"latency_ms":', '"latency_ms":NaN,"was":'),
        "a cap that is text": _broken(
            good, f'"{first_target}":{{"cap":', f'"{first_target}":{{"cap":"many","was":'
        ),
        "a cloud target without its value": _broken(good, '"value":', '"valeu":'),
        "a target without the headers it may receive": _broken(good, '"forward":', '"forwarded":'),
    }
    answers = _lua(gateway, [Group(group.policy, group.snapshot, text, group.cases) for text in bad.values()])
    for what, answer in zip(bad, answers, strict=True):
        assert "error" in answer and "results" not in answer, f"{what}: {answer}"
    assert "results" in _lua(gateway, [group])[0]
