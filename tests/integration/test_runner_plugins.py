"""The operator's own plugins beside Spillway's (``runner.plugins``): loaded by name at start, refused
with what is wrong, and served by the runner behind a real Apache APISIX 3.18 as a team's plugins
were by any other runner, since one APISIX runs one ext-plugin runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway_plugin.app import RunnerApp
from gateway_plugin.config import ConfigError, SpillwayConfig
from testing.apisix import StackStarter, needs_apisix
from testing.http import http
from testing.standins import StandIns

TEAM_PLUGIN = """
from pydantic import BaseModel
from gateway_plugin.plugin import HttpRequest, Plugin, RequestAction

class TeamConf(BaseModel):
    team: str

class TeamPlugin(Plugin[TeamConf]):
    name = "team"
    config_model = TeamConf

    async def request_filter(self, conf, request: HttpRequest, action: RequestAction) -> None:
        if request.path.startswith("/team/closed"):
            action.stop(403, b"closed to " + conf.team.encode())
            return
        action.set_header("x-team", conf.team)

class NotAPlugin:
    name = "team"
"""


def _config(*plugins: str) -> SpillwayConfig:
    return SpillwayConfig.model_validate({"runner": {"plugins": list(plugins)}, "metrics": {"listen": None}})


@pytest.fixture()
def team_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "team_plugins.py").write_text(TEAM_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_named_plugin_is_served_beside_spillways_own(team_module: Path) -> None:
    app = RunnerApp(_config("team_plugins:TeamPlugin"))
    assert sorted(app.plugins) == ["headers", "spillway", "team"]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("no_such_module:Thing", "cannot import 'no_such_module'"),
        ("team_plugins:NotAPlugin", "is not a subclass of gateway_plugin.plugin.Plugin"),
        ("team_plugins:Missing", "is not a subclass of gateway_plugin.plugin.Plugin"),
        ("gateway_plugin.plugins.headers:HeadersPlugin", "two plugins are named 'headers'"),
    ],
)
def test_a_plugin_that_cannot_be_served_stops_the_runner_saying_why(
    team_module: Path, spec: str, said: str
) -> None:
    with pytest.raises(ConfigError, match=r"runner\.plugins: ") as raised:
        RunnerApp(_config(spec))
    assert said in str(raised.value)


@pytest.mark.parametrize("spec", ["team_plugins", "team plugins:X", "team_plugins:X:Y", "../x:Y", ""])
def test_a_spec_that_names_no_class_is_refused_at_load(spec: str) -> None:
    with pytest.raises(ValidationError, match=r"runner\.plugins"):
        SpillwayConfig.model_validate({"runner": {"plugins": [spec]}})


@pytest.mark.integration
@needs_apisix()
def test_a_teams_plugin_rewrites_and_stops_requests_through_a_real_apisix(
    tmp_path: Path, stand_ins: StandIns, apisix_stack: StackStarter
) -> None:
    (tmp_path / "team_plugins.py").write_text(TEAM_PLUGIN)
    config = stand_ins.config()
    config["runner"] = {"plugins": ["team_plugins:TeamPlugin"]}
    host, _, port = stand_ins.local.url.removeprefix("http://").rpartition(":")
    team_route = {
        "id": "team",
        "uri": "/team/*",
        "plugins": {
            "ext-plugin-pre-req": {"conf": [{"name": "team", "value": json.dumps({"team": "search"})}]}
        },
        "upstream": {"type": "roundrobin", "nodes": {f"{host}:{port}": 1}},
    }
    # As an operator installs the package holding their plugin into the runner's environment.
    gateway = apisix_stack(config, [team_route], runner_env={"PYTHONPATH": str(tmp_path)}).gateway
    status, _, body = http("GET", gateway.url + "/team/open")
    assert status == 200 and json.loads(body)["headers"].get("x-team") == "search", (status, body)
    status, _, body = http("GET", gateway.url + "/team/closed/now")
    assert (status, body) == (403, b"closed to search")
    assert [seen["path"] for seen in stand_ins.local.seen] == ["/team/open"]


def test_the_runner_refuses_a_change_of_plugins_on_reload(team_module: Path, tmp_path: Path) -> None:
    path = tmp_path / "spillway.yaml"
    path.write_text(json.dumps({"metrics": {"listen": None}}))
    app = RunnerApp(_config(), path)
    path.write_text(
        json.dumps({"metrics": {"listen": None}, "runner": {"plugins": ["team_plugins:TeamPlugin"]}})
    )
    assert app.reload() is False
    assert sorted(app.plugins) == ["headers", "spillway"]
