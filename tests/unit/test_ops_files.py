"""The operator's files under ops/: Prometheus rules proven with promtool, Grafana dashboards and
their provisioning checked against Grafana's documented formats, and every alert's runbook."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import prometheus as prometheus_server
from devtools.generate import dashboards, stale
from testing.paths import ROOT

OPS = ROOT / "ops"
RULES = OPS / "prometheus" / "spillway-rules.yml"
RULE_TESTS = OPS / "prometheus" / "spillway-rules.test.yml"
DASHBOARDS = OPS / "grafana" / "dashboards"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason=prometheus_server.INSTALL_HINT)


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


def recording_rules() -> list[str]:
    return [rule["record"] for rule in _rules() if "record" in rule]


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_promtool_checks_the_rules_and_the_example_config() -> None:
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in checked.stdout
    config = _promtool("check", "config", str(OPS / "prometheus" / "prometheus.yml"))
    assert config.returncode == 0, config.stdout + config.stderr


@needs_promtool
def test_every_alert_fires_on_its_case_and_not_on_a_calm_one() -> None:
    tested = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    fires: set[str] = set()
    stays_calm: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check["exp_alerts"] else stays_calm).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert fires == names, "every alert needs a case where it fires"
    assert stays_calm == names, "every alert needs a case where it does not"


@needs_promtool
def test_a_broken_rule_fails_the_rule_tests(tmp_path: Path) -> None:
    """The rule tests can fail: with the breaker alert's threshold wrong, its case no longer fires."""
    (tmp_path / RULES.name).write_text(
        RULES.read_text().replace("(spillway_breaker_open) == 1", "(spillway_breaker_open) == 2")
    )
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    tested = _promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "SpillwayBreakerOpen" in tested.stdout + tested.stderr


def test_every_alert_says_what_and_has_a_runbook() -> None:
    runbooks = (ROOT / "docs" / "operating" / "alerts.md").read_text()
    for alert in alerts():
        name = alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], name
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}, name
        assert re.search(rf"^## `{name}`$", runbooks, re.MULTILINE), (
            f"docs/operating/alerts.md has no runbook for {name}"
        )


def test_the_dashboards_are_what_the_generator_makes() -> None:
    made = dashboards.files()
    assert sorted(made) == sorted(DASHBOARDS.glob("*.json"))
    assert not stale(made), "regenerate: python -m devtools.generate dashboards"


def panels() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            found.append((path.name, panel))
    return found


def test_dashboards_read_at_a_glance() -> None:
    """Unique ids, the datasource by variable, units, named legends, thresholds that draw."""
    uids = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        assert board["uid"] not in uids and len(board["uid"]) <= 40
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert (
            variables["datasource"]["type"] == "datasource"
            and variables["datasource"]["query"] == "prometheus"
        )
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in board["panels"]:
            where = f"{path.name}: {panel['title']}"
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            defaults = panel["fieldConfig"]["defaults"]
            assert defaults.get("unit"), f"{where}: no unit"
            steps = defaults["thresholds"]["steps"]
            assert steps[0]["value"] is None and all(s["value"] is not None for s in steps[1:]), where
            if panel["type"] == "timeseries" and len(steps) > 1:
                assert defaults["custom"]["thresholdsStyle"]["mode"] != "off", (
                    f"{where}: thresholds not drawn"
                )
            assert panel["targets"], where
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", where
                assert target["legendFormat"] and target["legendFormat"] != "__auto", where
                assert re.search(r"\bspillway_|\bapisix_", target["expr"]), where
            x, w = panel["gridPos"]["x"], panel["gridPos"]["w"]
            assert x >= 0 and x + w <= 24, where


def test_the_provisioning_files_load_the_dashboards() -> None:
    """Grafana's documented provisioning format: apiVersion 1, a Prometheus datasource whose uid is
    stable, and a file provider with a folder and a path."""
    sources = yaml.safe_load((OPS / "grafana" / "provisioning" / "datasources" / "spillway.yaml").read_text())
    assert sources["apiVersion"] == 1
    (source,) = sources["datasources"]
    assert {"name", "type", "access", "url", "uid"} <= set(source)
    assert source["type"] == "prometheus" and source["access"] in {"proxy", "direct"}
    boards = yaml.safe_load((OPS / "grafana" / "provisioning" / "dashboards" / "spillway.yaml").read_text())
    assert boards["apiVersion"] == 1
    (provider,) = boards["providers"]
    assert provider["type"] == "file" and provider["folder"] and provider["options"]["path"]
    assert set(provider) <= {
        "name",
        "orgId",
        "folder",
        "folderUid",
        "type",
        "disableDeletion",
        "allowUiUpdates",
        "updateIntervalSeconds",
        "options",
    }
