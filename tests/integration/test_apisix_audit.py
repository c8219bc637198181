"""The audit trail on a real APISIX: one line per request, written by APISIX's own file-logger, on
the ext-plugin route and on the fast path, each line carrying the request's true decision (what the
client was answered with) and nothing secret."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway_plugin.apisix_route import route
from gateway_plugin.books.target_header import target_value
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from gateway_plugin.request.audit import HEADER_AUDIT, LOG_FORMAT
from testing.apisix import Stack, StackStarter, example_plugins, needs_apisix
from testing.http import http, wait_until
from testing.standins import StandIns

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"]
SIGNING_KEY = "audit-signing-key-0123456789abcdef"
FAST_HOST = "fast.test"


class Audited(Stack):
    log: Path


@pytest.fixture(scope="module")
def stack(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Audited:
    config = module_stand_ins.config("SPILLWAY_SIGNING_KEY")
    log = module_apisix_stack.tmp / "audit.log"
    config["audit"] = {"logger": "file-logger", "conf": {"path": str(log)}}
    parsed = SpillwayConfig.model_validate(config)
    fast = fast_route(parsed, TOKEN.encode())
    fast["host"] = FAST_HOST
    routes = [yaml.safe_load(yaml.safe_dump(r)) for r in (route(parsed, TOKEN.encode()), fast)]
    plugins = [*example_plugins(), "spillway", "file-logger"]
    made = Audited.of(module_apisix_stack(config, routes, plugins=plugins, signing_key=SIGNING_KEY))
    made.log = log
    return made


def _send(stack: Stack, model: str, fast: bool, headers: dict[str, str], path: str = "") -> dict[str, Any]:
    sent = {"content-type": "application/json", **headers, **({"host": FAST_HOST} if fast else {})}
    url = stack.gateway.url + (path or f"/v2/models/{model}/infer")
    status, answer, _ = http("POST", url, b"{}", sent)
    return {"model": model, "fast": fast, "status": status, "answer": answer, "sent": headers}


def _lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _mixed_run(stack: Stack) -> list[dict[str, Any]]:
    """Local, kept home, over quota, spilled and refused requests, on both routes, one at a time."""
    done = []
    for fast in (False, True):
        n = len(done)
        stack.set_load(0)
        for i, headers in enumerate(
            (
                {"x-data-classification": "public", "x-tenant": "acme"},
                {"x-data-classification": "confidential", "x-tenant": "acme"},
                {"x-data-classification": "public", "x-tenant": "tiny"},
                {"x-data-classification": "public", "x-tenant": "tiny"},
            )
        ):
            done.append(_send(stack, f"m{fast:d}-{n + i}", fast, headers))
        stack.set_load(500)
        for i, headers in enumerate(
            (
                {"x-data-classification": "public", "x-tenant": "beta"},
                {"x-data-classification": "secret", "x-tenant": "beta"},
                {"x-data-classification": "public"},
            )
        ):
            done.append(_send(stack, f"m{fast:d}-{n + 4 + i}", fast, headers))
        # Refused before any decision: a path encoded twice.
        done.append(_send(stack, "", fast, {"x-tenant": "acme"}, "/v2/models/secre%2574/infer"))
    return done


def test_each_request_has_a_line_with_its_true_decision_and_nothing_secret(stack: Audited) -> None:
    done = _mixed_run(stack)

    def written() -> bool:
        lines = _lines(stack.log)
        decided = sum(1 for line in lines if line.get("model", "").startswith("m"))
        return decided >= 14 and sum(1 for line in lines if line["decision"] == "refused") >= 2

    # Each line is written in the log phase, after its answer went out.
    wait_until(written, 10, "a line for every request")
    lines = _lines(stack.log)
    by_model = {line["model"]: line for line in lines if line.get("model")}
    decided = [d for d in done if d["model"]]
    kinds = set()
    for d in decided:
        line = by_model[d["model"]]
        target, _, reason = d["answer"]["x-spillway-decision"].partition(";")
        kind = target if target in ("local", "shed") else "cloud"
        kinds.add(kind)
        assert (line["target"], line["reason"], line["decision"]) == (target, reason, kind), line
        assert line["status"] == d["status"], line
        assert line["via"] == ("fast_path" if d["fast"] else "ext_plugin"), line
        assert line.get("tenant") == d["sent"].get("x-tenant"), line
        assert line["classification"] == d["sent"]["x-data-classification"], line
        assert (float(line["cost_usd"]) > 0) == (kind == "cloud"), line
        assert len(line["request_id"]) == 32 and set(line) <= set(LOG_FORMAT), line
        assert HEADER_AUDIT.lower() not in d["answer"], "the audit header reached the client"
    assert kinds == {"local", "shed", "cloud"}
    refused = [line for line in lines if line["decision"] == "refused"]
    assert sorted((line["via"], line["status"], line["reason"]) for line in refused) == [
        ("ext_plugin", 400, "400"),
        ("fast_path", 400, "400"),
    ]
    text = stack.log.read_text()
    secrets = [TOKEN, SIGNING_KEY, target_value("aws", TOKEN.encode())]
    secrets += [seen["headers"]["x-spillway-signature"] for seen in stack.aws.seen]
    assert stack.aws.seen and not [s for s in secrets if s in text]
    assert not any(
        HEADER_AUDIT.lower() in seen["headers"] for up in (stack.aws, stack.local) for seen in up.seen
    )


def test_an_upstream_cannot_write_the_audit_trail(stack: Audited) -> None:
    """A function (or an on-prem node) answering with its own X-Spillway-Audit neither reaches the
    client with it nor changes the line: the runner's fields are taken before the request leaves."""
    forged = "local;local;local_ok;forged;public;forged-model;0"
    stack.aws.extra_headers["X-Spillway-Audit"] = forged
    stack.local.extra_headers["X-Spillway-Audit"] = forged
    try:
        stack.set_load(500)
        spilled = _send(
            stack, "m-hostile-cloud", False, {"x-data-classification": "public", "x-tenant": "acme"}
        )
        stack.set_load(0)
        kept = _send(stack, "m-hostile-local", False, {"x-data-classification": "public", "x-tenant": "acme"})
    finally:
        stack.aws.extra_headers.clear()
        stack.local.extra_headers.clear()
    for sent in (spilled, kept):
        assert HEADER_AUDIT.lower() not in sent["answer"]
    wait_until(
        lambda: {"m-hostile-cloud", "m-hostile-local"} <= {line.get("model") for line in _lines(stack.log)},
        10,
        "lines",
    )
    by_model = {line.get("model"): line for line in _lines(stack.log)}
    assert (
        by_model["m-hostile-cloud"]["decision"] == "cloud" and by_model["m-hostile-cloud"]["tenant"] == "acme"
    )
    assert by_model["m-hostile-local"]["tenant"] == "acme"
    text = stack.log.read_text()
    assert "forged-model" not in text and '"tenant":"forged"' not in text
