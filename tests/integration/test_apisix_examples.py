"""The example APISIX files, proven: they are what ``apisix-route`` makes from the example config, and
a real APISIX 3.18 loads them (with the example config's plugin list) and routes through them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.apisix import Apisix
from devtools.generate import examples, stale
from functions.sidecar import free_port
from testing.apisix import gateway_for, needs_apisix
from testing.cloud_apis import AWS_KEY, AWS_SECRET, function_url_fake
from testing.examples import EXAMPLE_ENVS, example_config, loopback_route
from testing.function import ADD_SUB_BODY, Running, function_server, model_repository
from testing.http import http, wait_until
from testing.paths import ROOT
from testing.standins import metrics_feed, upstream

EXAMPLES = examples.OUT
EXAMPLE_TOKEN = examples.EXAMPLE_TOKEN


@pytest.mark.parametrize("name", sorted(examples.EXAMPLES))
def test_the_examples_are_what_the_generator_makes(name: str) -> None:
    path = examples.OUT / name
    assert not stale({path: examples.made(*examples.EXAMPLES[name])}), (
        f"regenerate: python -m devtools.generate examples ({name})"
    )


@pytest.fixture
def cloud_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPILLWAY_ROUTE_TOKEN", EXAMPLE_TOKEN)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAIexample")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "example")
    monkeypatch.setenv("SPILLWAY_SIGNING_KEY", "example-signing-key-0123456789abcdef")


def _decision(answer: tuple[int, dict[str, str], bytes]) -> str:
    return answer[1].get("x-spillway-decision", "")


@pytest.mark.integration
@needs_apisix()
def test_the_example_route_as_apisix_loads_it(tmp_path: Path, cloud_env: None) -> None:
    with ExitStack() as stack:
        local = stack.enter_context(upstream("local"))
        aws = stack.enter_context(upstream("aws", instance="fn-1"))
        feed = stack.enter_context(metrics_feed())
        config = example_config(local.url, aws.url, feed.url, f"127.0.0.1:{free_port()}")
        route = loopback_route(yaml.safe_load((EXAMPLES / "apisix.yaml").read_text())["routes"][0], config)
        gateway = stack.enter_context(gateway_for(config, tmp_path, [route], envs=EXAMPLE_ENVS))
        url = gateway.url + "/v2/models/add_sub/infer"
        headers = {"x-data-classification": "public", "content-type": "application/json"}
        feed.queue_ms = 500
        wait_until(lambda: _decision(http("POST", url, b"{}", headers)).startswith("aws;"), 30, "overflow")
        assert json.loads(http("POST", url, b"{}", headers)[2])["upstream"] == "aws"
        secret = http("POST", url, b"{}", {**headers, "x-data-classification": "confidential"})
        assert json.loads(secret[2])["upstream"] == "local"
        assert "failed to check" not in gateway.error_log(), "APISIX refused part of the route"


@pytest.fixture(scope="module")
def real_function(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("fn")
    with function_server(model_repository(tmp, "add_sub"), tmp, platform="aliyun-fc") as running:
        yield running


@pytest.mark.integration
@needs_apisix()
def test_the_lambda_iam_route_signs_with_sigv4_and_keeps_the_path(
    tmp_path: Path, cloud_env: None, real_function: Running
) -> None:
    """APISIX's aws-lambda plugin, gated on the runner's decision, reaches the function URL signed,
    with the whole /v2/... path, even when the client sent its own Authorization."""
    with ExitStack() as stack:
        local = stack.enter_context(upstream("local"))
        fn_url = stack.enter_context(function_url_fake(real_function.url))
        feed = stack.enter_context(metrics_feed())
        config = example_config(local.url, fn_url.url, feed.url, f"127.0.0.1:{free_port()}")
        config["targets"][0]["signing_key_env"] = None
        route = loopback_route(json.loads((EXAMPLES / "route-lambda-iam.json").read_text()), config)
        gateway = stack.enter_context(gateway_for(config, tmp_path, [route], envs=EXAMPLE_ENVS))
        url = gateway.url + "/v2/models/add_sub/infer"
        headers = {
            "x-data-classification": "public",
            "content-type": "application/json",
            "authorization": "Bearer the-clients-own-token",
        }
        feed.queue_ms = 500
        spill = lambda: _decision(http("POST", url, ADD_SUB_BODY, headers)).startswith("aws;")  # noqa: E731
        wait_until(spill, 30, "a public request spills through aws-lambda")
        status, _, body = http("POST", url, ADD_SUB_BODY, headers)
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [11, 22, 33, 44]
    assert fn_url.invalid == [], "every request reaching the function URL was signed"
    assert set(fn_url.paths) == {"/v2/models/add_sub/infer"}


@pytest.mark.integration
@needs_apisix()
def test_an_invoke_mode_answer_reaches_the_client(
    tmp_path: Path, cloud_env: None, real_function: Running
) -> None:
    """In invoke mode the runner calls Lambda's Invoke API itself (SigV4) and APISIX answers the
    client with the function's answer (a Stop)."""
    from testing.cloud_apis import REGION, cloud_fake

    with ExitStack() as stack:
        local = stack.enter_context(upstream("local"))
        feed = stack.enter_context(metrics_feed())
        lambda_api = stack.enter_context(cloud_fake(real_function.url))
        config = example_config(local.url, "http://127.0.0.1:9", feed.url, f"127.0.0.1:{free_port()}")
        config["targets"] = [
            {
                "name": "aws",
                "kind": "aws_lambda",
                "mode": "invoke",
                "function_name": "spillway-infer",
                "region": REGION,
                "endpoint_url": lambda_api.url,
                "signing_key_env": None,
            }
        ]
        config["rules"] = [
            {"name": "out", "match": {"models": ["add_sub"]}, "action": "target", "targets": ["aws"]}
        ]
        config["budgets"] = {}
        gateway = stack.enter_context(gateway_for(config, tmp_path, envs=EXAMPLE_ENVS))
        headers = {"x-data-classification": "public", "content-type": "application/json"}
        status, answer_headers, body = http(
            "POST", gateway.url + "/v2/models/add_sub/infer", ADD_SUB_BODY, headers
        )
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [11, 22, 33, 44]
    assert answer_headers["x-spillway-decision"].startswith("aws;")
    assert answer_headers.get("x-spillway-instance"), "the function's own headers come through"
    assert lambda_api.valid == 1 and lambda_api.invalid == []
    assert local.seen == [], "nothing went on premises"


@pytest.mark.parametrize(
    ("name", "plugins"),
    [
        ("config-fast-path.yaml", {"spillway"}),
        ("config.yaml", {"spillway-edge", "traffic-split"}),
    ],
)
def test_the_config_excerpts_hold_what_the_lua_plugins_need(name: str, plugins: set[str]) -> None:
    from gateway_plugin.config import load
    from gateway_plugin.fast_path.route import SHARED_DICT, config_snippet

    example = yaml.safe_load((EXAMPLES / name).read_text())
    wanted = config_snippet(load(ROOT / "examples" / "spillway.yaml"))
    assert example["apisix"]["extra_lua_path"].endswith("/gateway_plugin/fast_path/lua/?.lua")
    assert example["nginx_config"]["http"]["custom_lua_shared_dict"][SHARED_DICT]
    assert set(wanted["nginx_config"]["envs"]) <= set(example["nginx_config"]["envs"]), "every key named"
    assert wanted["plugin_attr"]["spillway"].items() <= example["plugin_attr"]["spillway"].items()
    assert plugins <= set(example["plugins"])
    verify = wanted["nginx_config"]["http_server_location_configuration_snippet"]
    assert example["nginx_config"]["http_server_location_configuration_snippet"] == verify
    assert example["apisix"]["ssl"] == wanted["apisix"]["ssl"]


def _example_apisix(config: dict[str, Any], tmp: Path, fast_path: bool) -> AbstractContextManager[Apisix]:
    """APISIX serving the example route of one mode or the other (hosts moved to loopback)."""
    name = "apisix-fast-path.yaml" if fast_path else "apisix.yaml"
    route = loopback_route(yaml.safe_load((EXAMPLES / name).read_text())["routes"][0], config)
    return gateway_for(config, tmp, [route], fast_path=fast_path, envs=EXAMPLE_ENVS)


@pytest.mark.integration
@needs_apisix()
@pytest.mark.parametrize("fast_path", [False, True], ids=["ext-plugin", "fast-path"])
@pytest.mark.parametrize("sign_body", [False, True])
def test_signatures_made_from_the_call_verify_at_the_function_whatever_the_target_looks_like(
    tmp_path: Path, cloud_env: None, sign_body: bool, fast_path: bool
) -> None:
    """The gateway signs nginx's decoded path and argument table (the runner in Python, the fast
    path in Lua), the function the raw request line APISIX forwards: escapes, dot segments, repeated
    and valueless arguments must not tell them apart."""
    key = os.environ["SPILLWAY_SIGNING_KEY"]
    env = {"SPILLWAY_SIGNING_KEY": key, "SPILLWAY_ALLOW_UNSIGNED_PAYLOAD": "0" if sign_body else "1"}
    with ExitStack() as stack:
        fn = stack.enter_context(function_server(model_repository(tmp_path, "add_sub"), tmp_path, **env))
        local = stack.enter_context(upstream("local"))
        feed = stack.enter_context(metrics_feed())
        config = example_config(local.url, fn.url, feed.url, f"127.0.0.1:{free_port()}")
        config["targets"][0]["sign_body"] = sign_body
        gateway = stack.enter_context(_example_apisix(config, tmp_path, fast_path))
        headers = {"x-data-classification": "public", "content-type": "application/json"}
        feed.queue_ms = 500
        plain = gateway.url + "/v2/models/add_sub/infer"
        spill = lambda: _decision(http("POST", plain, ADD_SUB_BODY, headers)).startswith("aws;")  # noqa: E731
        wait_until(spill, 30, "a public request spills")
        kept_home = len(local.seen)
        answers = {
            target: http("POST", gateway.url + target, ADD_SUB_BODY, headers)
            for target in (
                "/v2/models/add_sub/infer?b=2&a=x+y&a=%2B&flag&empty=",
                "/v2/models/add_%73ub/infer",
                "/v2/models//add_sub/./infer?%E2%9C%93=%C3%A9",
                "/v2/models/other/../add_sub/infer?a=1&a=1",
            )
        }
    for target, (status, answer_headers, body) in answers.items():
        assert answer_headers.get("x-spillway-decision", "").startswith("aws;"), target
        assert status == 200, f"{target}: {body!r}"
        assert json.loads(body)["outputs"][0]["data"] == [11, 22, 33, 44], target
    assert len(local.seen) == kept_home, "every request spilled"
