"""Provisioning and images: security properties of infra/terraform, the warm-up payload the
schedules send against the function's real event parser, and the images' wiring."""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from functions.contract import WarmupPing, warmup_payload
from functions.events import parse_event
from functions.settings import IMAGE_MODEL_REPOSITORY
from functions.sidecar import free_port
from testing.function import ADD_SUB_BODY, model_repository
from testing.http import wait_until
from testing.terraform import (
    LONG_ROLE,
    PROVIDER_VALUES,
    Module,
    Unknown,
    accepts,
    blocks,
    dockerfile_instructions,
    exec_form,
    load_module,
    preconditions,
    references,
    tf_jsonencode,
)

ROOT = Path(__file__).resolve().parents[2]
TF = ROOT / "infra" / "terraform"
IMAGES = ROOT / "images"
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:spillway-key-AbCdEf"
ACR_IMAGE = "registry-vpc.cn-hangzhou.aliyuncs.com/spillway/aliyun-fc:0.1.0"
# signing_key_oss as Terraform passes it: the optional endpoint is null when not given.
KEY_OSS = {
    "bucket": "spillway-keys",
    "object_dir": "fn/add-sub",
    "file_name": "signing.key",
    "endpoint": None,
}
SIGNING_KEY_ENV = (
    "SPILLWAY_SIGNING_KEY",
    "SPILLWAY_SIGNING_KEY_FILE",
    "SPILLWAY_SIGNING_KEY_SECRET_ARN",
    "SPILLWAY_SIGNING_KEY_SECRET_NAME",
)


@pytest.fixture(scope="module")
def aws() -> Module:
    return load_module(TF / "modules" / "aws_function")


@pytest.fixture(scope="module")
def aliyun() -> Module:
    return load_module(TF / "modules" / "aliyun_function")


@pytest.fixture(scope="module")
def example() -> Module:
    return load_module(TF / "examples" / "hybrid")


def aws_eval(aws: Module, **values: Any) -> Any:
    return aws.evaluator(**{"name": "fn", "reserved_concurrent_executions": 4, **values})


def aliyun_eval(aliyun: Module, **values: Any) -> Any:
    return aliyun.evaluator(**{"name": "fn", "reserved_concurrency": 8, "image": ACR_IMAGE, **values})


# -- the warm-up payload: Terraform's rendering == the contract == what the adapters accept --


def contract_payload(values: dict[str, Any]) -> str:
    return warmup_payload(
        dwell_ms=values["warmup_dwell_ms"], models=tuple(values["models"]), probe=values["warmup_probe"]
    )


@pytest.mark.parametrize("which", ["aws", "aliyun"])
def test_default_warmup_payload_is_the_contract_and_parses_as_a_ping(which: str, request: Any) -> None:
    module: Module = request.getfixturevalue(which)
    defaults = module.defaults()
    evaluator = aws_eval(module) if which == "aws" else aliyun_eval(module)
    rendered = evaluator.local("warmup_payload")
    assert rendered == contract_payload(defaults)
    ping = parse_event(rendered)
    assert isinstance(ping, WarmupPing)
    assert (ping.dwell_ms, ping.models, ping.probe) == (
        defaults["warmup_dwell_ms"],
        tuple(defaults["models"]),
        defaults["warmup_probe"],
    )


@pytest.mark.parametrize("which", ["aws", "aliyun"])
def test_every_payload_variable_reaches_the_payload(which: str, request: Any) -> None:
    module: Module = request.getfixturevalue(which)
    values = {"warmup_dwell_ms": 1234, "models": ["add_sub", "resnet-50.v2"], "warmup_probe": True}
    evaluator = aws_eval(module, **values) if which == "aws" else aliyun_eval(module, **values)
    rendered = evaluator.local("warmup_payload")
    assert rendered == contract_payload(values)
    assert parse_event(rendered) == WarmupPing(dwell_ms=1234, models=("add_sub", "resnet-50.v2"), probe=True)


def test_tf_jsonencode_escapes_like_terraform() -> None:
    assert tf_jsonencode({"b": 1, "a": ["<x>&"]}) == '{"a":["\\u003cx\\u003e\\u0026"],"b":1}'


def test_schedules_send_the_payload_to_the_alias(aws: Module) -> None:
    schedule = aws.resource("aws_scheduler_schedule", "this")
    target = schedule["target"][0]
    assert target["input"] == "${local.warmup_payload}"
    assert target["arn"] == "${local.invoke_arn}"
    evaluator = aws_eval(aws)
    assert evaluator.value(schedule["count"]) == aws.defaults()["warmup_pings"] >= 1
    assert aws_eval(aws, warmup_pings=0).value(schedule["count"]) == 0
    assert evaluator.local("invoke_arn") == "aws_lambda_alias.this[0].arn"
    assert aws_eval(aws, create_alias=False).local("invoke_arn") == "aws_lambda_function.this[0].arn"


def test_failed_pings_are_not_retried(aws: Module) -> None:
    """Scheduler invokes the function asynchronously: Lambda would retry a failed ping twice and
    keep a throttled one for hours unless the invoke config of the qualifier it calls says not."""
    config = aws.resource("aws_lambda_function_event_invoke_config", "this")
    assert config["maximum_retry_attempts"] == 0
    assert config["maximum_event_age_in_seconds"] == 60
    assert config["qualifier"] == "${local.qualifier}"
    for create_alias in (True, False):
        evaluator = aws_eval(aws, create_alias=create_alias)
        qualifier = evaluator.local("qualifier")
        arn = evaluator.local("invoke_arn")
        assert (qualifier is not None) == arn.startswith("aws_lambda_alias."), (qualifier, arn)
    schedule = aws.resource("aws_scheduler_schedule", "this")
    assert schedule["target"][0]["retry_policy"][0]["maximum_retry_attempts"] == 0
    assert aws_eval(aws).value(config["count"]) == 1
    assert aws_eval(aws, warmup_pings=0).value(config["count"]) == 0
    assert aws_eval(aws, create=False).value(config["count"]) == 0
    readme = (TF / "modules" / "aws_function" / "README.md").read_text()
    assert "aws_lambda_function_event_invoke_config" in readme


def test_fc_timer_triggers_carry_the_payload_in_the_event_fc_sends(aliyun: Module) -> None:
    trigger = aliyun.resource("alicloud_fcv3_trigger", "warmup")
    assert trigger["trigger_type"] == "timer"
    evaluator = aliyun_eval(aliyun)
    assert evaluator.value(trigger["count"]) == aliyun.defaults()["warmup_pings"] >= 1
    config = json.loads(evaluator.value(trigger["trigger_config"]))
    assert config["enable"] is True
    assert config["cronExpression"] == aliyun.defaults()["warmup_cron_expression"]
    assert config["payload"] == contract_payload(aliyun.defaults())
    timer_event = {
        "triggerTime": "2026-01-01T00:00:00Z",
        "triggerName": "spillway-warmup-0",
        "payload": config["payload"],
    }
    ping = parse_event(json.dumps(timer_event).encode())
    assert isinstance(ping, WarmupPing) and ping.models == tuple(aliyun.defaults()["models"])


def test_warmup_schedules_module_builds_what_the_modules_deploy(aws: Module, aliyun: Module) -> None:
    """warmup/schedules.py describes the modules' schedules: same aligned tick, same ping."""
    from gateway_plugin.config import WarmTarget
    from warmup import schedules

    for module in (aws, aliyun):
        d = module.defaults()
        spec = WarmTarget(dwell_ms=d["warmup_dwell_ms"], models=d["models"], probe=d["warmup_probe"])
        evaluator = aws_eval(module) if module is aws else aliyun_eval(module)
        assert schedules.ping_payload(spec) == evaluator.local("warmup_payload")
    aws_tick = aws.defaults()["warmup_schedule_expression"]
    assert aws_tick == "cron(0/5 * * * ? *)"
    eventbridge = schedules.eventbridge_schedule(WarmTarget(), 300)
    assert eventbridge["schedule_expression"] == aws_tick
    schedule = aws.resource("aws_scheduler_schedule", "this")
    assert eventbridge["schedule_expression_timezone"] == schedule["schedule_expression_timezone"]
    assert eventbridge["flexible_time_window"] == schedule["flexible_time_window"][0]
    fc_tick = aliyun.defaults()["warmup_cron_expression"]
    assert fc_tick == "0 0/3 * * * *"
    assert schedules.fc_timer_trigger(WarmTarget(), 180)["cronExpression"] == fc_tick


# -- AWS module: security properties --


def test_reserved_concurrency_is_a_required_positive_whole_number(aws: Module) -> None:
    assert "default" not in aws.variables["reserved_concurrent_executions"]
    function = aws.resource("aws_lambda_function", "this")
    assert function["reserved_concurrent_executions"] == "${var.reserved_concurrent_executions}"
    for bad in (0, -1, 2.5):
        assert not accepts(aws, "reserved_concurrent_executions", bad)
    assert accepts(aws, "reserved_concurrent_executions", 1)


def test_function_url_uses_iam_unless_a_signing_secret_is_mandatory(aws: Module) -> None:
    url = aws.resource("aws_lambda_function_url", "this")
    assert url["authorization_type"] == "${var.function_url_authorization_type}"
    assert aws.defaults()["function_url_authorization_type"] == "AWS_IAM"
    assert not accepts(aws, "function_url_authorization_type", "none")
    checks = preconditions(url)
    assert checks, "the function URL needs a precondition tying NONE to a signing secret"

    def allowed(auth: str, secret: str | None) -> bool:
        evaluator = aws_eval(aws, function_url_authorization_type=auth, signing_key_secret_arn=secret)
        return all(evaluator.value(check["condition"]) for check in checks)

    assert not allowed("NONE", None)
    assert allowed("NONE", SECRET_ARN)
    assert allowed("AWS_IAM", None)


def permissions(aws: Module) -> dict[str, dict[str, Any]]:
    return {name: body for (kind, name), body in aws.resources.items() if kind == "aws_lambda_permission"}


def test_a_none_url_grants_anyone_invoke_through_the_url_only(aws: Module) -> None:
    """Since October 2025 a URL call needs lambda:InvokeFunctionUrl and lambda:InvokeFunction.
    For NONE the URL resource grants anyone the first when it creates the URL; the one public
    permission here is the second, only through the URL, on the URL's qualifier."""
    public = {name: body for name, body in permissions(aws).items() if body["principal"] == "*"}
    assert list(public) == ["public_url"]
    body = public["public_url"]
    assert body["action"] == "lambda:InvokeFunction"
    assert body["invoked_via_function_url"] is True
    assert "function_url_auth_type" not in body and "source_arn" not in body
    url = aws.resource("aws_lambda_function_url", "this")
    assert body["qualifier"] == url["qualifier"] == "${local.qualifier}"
    assert url["authorization_type"] == "${var.function_url_authorization_type}"
    assert aws_eval(aws).value(body["count"]) == 0
    none = {"function_url_authorization_type": "NONE", "signing_key_secret_arn": SECRET_ARN}
    assert aws_eval(aws, **none).value(body["count"]) == 1
    assert aws_eval(aws, **none, create_function_url=False).value(body["count"]) == 0
    assert aws_eval(aws, **none, create=False).value(body["count"]) == 0
    for name, other in permissions(aws).items():
        if name != "public_url":
            assert other["principal"] == "${each.value}", name
    assert not accepts(aws, "invoker_principal_arns", ["*"])
    assert accepts(aws, "invoker_principal_arns", ["arn:aws:iam::123456789012:role/gateway"])


def test_a_new_auth_type_replaces_the_url(aws: Module) -> None:
    """The provider adds a NONE URL's public statements on creation only, never on update."""
    url = aws.resource("aws_lambda_function_url", "this")
    [lifecycle] = url["lifecycle"]
    assert lifecycle["replace_triggered_by"] == ["${terraform_data.url_authorization_type[count.index]}"]
    trigger = aws.resource("terraform_data", "url_authorization_type")
    assert trigger["input"] == "${var.function_url_authorization_type}"
    assert trigger["count"] == url["count"]


def test_an_iam_url_grants_its_callers_both_url_actions(aws: Module) -> None:
    invoke_url, invoke = permissions(aws)["invoke_url"], permissions(aws)["invoke"]
    assert invoke_url["action"] == "lambda:InvokeFunctionUrl"
    assert invoke_url["function_url_auth_type"] == "AWS_IAM"
    assert invoke["action"] == "lambda:InvokeFunction" and "invoked_via_function_url" not in invoke
    for body in (invoke_url, invoke):
        assert body["qualifier"] == "${local.qualifier}"
        assert "local.invoker_principal" in body["for_each"]
    # Every principal that may call the IAM URL may invoke too: invoke is created whenever
    # invoke_url is.
    principals = ["arn:aws:iam::123456789012:role/gateway"]
    evaluator = aws_eval(aws, invoker_principal_arns=principals)
    assert evaluator.value(invoke_url["for_each"]) == evaluator.value(invoke["for_each"])
    assert list(evaluator.value(invoke["for_each"]).values()) == principals


def test_url_conditions_only_go_with_the_actions_aws_accepts_them_for(aws: Module) -> None:
    """AddPermission takes FunctionUrlAuthType only with lambda:InvokeFunctionUrl, and
    InvokedViaFunctionUrl only with lambda:InvokeFunction."""
    for name, body in permissions(aws).items():
        if "function_url_auth_type" in body:
            assert body["action"] == "lambda:InvokeFunctionUrl", name
        if "invoked_via_function_url" in body:
            assert body["action"] == "lambda:InvokeFunction", name


def test_modules_require_the_provider_versions_they_use(aws: Module, aliyun: Module, example: Module) -> None:
    """Reusable modules declare minimums, as terraform-aws-modules does; the example, a root,
    stays on one major version. invoked_via_function_url arrived in hashicorp/aws 6.28."""

    def constraints(module: Module) -> dict[str, str]:
        [block] = module.terraform
        [providers] = block["required_providers"]
        return {name: spec["version"] for name, spec in providers.items() if not name.startswith("__")}

    assert constraints(aws) == {"aws": ">= 6.28"}
    assert constraints(aliyun) == {"alicloud": ">= 1.252.0"}
    assert constraints(example) == {"aws": "~> 6.28", "alicloud": "~> 1.252"}


def test_signing_key_comes_from_secrets_manager_never_a_literal(aws: Module) -> None:
    for literal in ("SPILLWAY_SIGNING_KEY", "SPILLWAY_SIGNING_KEY_FILE"):
        assert not accepts(aws, "environment_variables", {literal: "hunter2"})
    assert not accepts(aws, "signing_key_secret_arn", "hunter2")
    function = aws.resource("aws_lambda_function", "this")
    assert function["environment"][0]["variables"] == "${local.environment}"
    env = aws_eval(
        aws, signing_key_secret_arn=SECRET_ARN, environment_variables={"SPILLWAY_MODELS": "x"}
    ).local("environment")
    assert env["SPILLWAY_SIGNING_KEY_SECRET_ARN"] == SECRET_ARN
    assert env["SPILLWAY_MODELS"] == "add_sub"
    assert env["SPILLWAY_MODEL_REPOSITORY"] == IMAGE_MODEL_REPOSITORY
    assert not any(key in env for key in ("SPILLWAY_SIGNING_KEY", "SPILLWAY_SIGNING_KEY_FILE"))
    assert "SPILLWAY_SIGNING_KEY_SECRET_ARN" not in aws_eval(aws).local("environment")


def test_execution_role_reaches_only_its_log_group_and_the_secret(aws: Module) -> None:
    policy = aws.data[("aws_iam_policy_document", "execution")]
    allowed = {
        "logs:CreateLogStream": {"${aws_cloudwatch_log_group.this[0].arn}:*"},
        "secretsmanager:GetSecretValue": {"${statement.value}"},
        "kms:Decrypt": {"${statement.value}"},
    }
    for statement in blocks(policy, "statement"):
        assert "*" not in "".join(statement["actions"]), statement
        for action in statement["actions"]:
            assert set(statement["resources"]) <= allowed.get(action, allowed["logs:CreateLogStream"]), (
                statement
            )
    dynamic_sources = [dyn["statement"]["for_each"] for dyn in policy.get("dynamic", [])]
    assert all(
        references(src) <= {"var.signing_key_secret_arn", "var.signing_key_kms_key_arn"}
        for src in dynamic_sources
    )
    for source in dynamic_sources:
        evaluator = aws_eval(aws, signing_key_secret_arn=SECRET_ARN)
        assert evaluator.value(source) in ([], [SECRET_ARN])
    kms = [s for s in blocks(policy, "statement") if s["actions"] == ["kms:Decrypt"]]
    assert all(c["variable"] == "kms:ViaService" for s in kms for c in s["condition"])
    log_group = aws.resource("aws_cloudwatch_log_group", "this")
    assert log_group["name"] == "/aws/lambda/${var.name}"
    role_policies = [(k, b) for k, b in aws.resources.items() if k[0] == "aws_iam_role_policy"]
    assert {b["role"] for _, b in role_policies} == {
        "${aws_iam_role.this[0].id}",
        "${aws_iam_role.scheduler[0].id}",
    }
    assert not [k for k in aws.resources if k[0] in ("aws_iam_role_policy_attachment", "aws_iam_policy")]
    assert all("managed_policy_arns" not in b for k, b in aws.resources.items() if k[0] == "aws_iam_role")


def test_scheduler_role_may_only_invoke_this_function(aws: Module) -> None:
    policy = aws.data[("aws_iam_policy_document", "scheduler")]
    statements = blocks(policy, "statement")
    assert len(statements) == 1 and not policy.get("dynamic")
    assert statements[0]["actions"] == ["lambda:InvokeFunction"]
    assert statements[0]["resources"] == ["${local.invoke_arn}"]
    assert references(aws.locals["invoke_arn"]) <= {
        "var.create_alias",
        "aws_lambda_alias.this",
        "aws_lambda_function.this",
    }
    targets = {True: "aws_lambda_alias.this[0].arn", False: "aws_lambda_function.this[0].arn"}
    for create_alias, arn in targets.items():
        assert aws_eval(aws, create_alias=create_alias).local("invoke_arn") == arn
    role_policy = aws.resource("aws_iam_role_policy", "scheduler")
    assert role_policy["policy"] == "${data.aws_iam_policy_document.scheduler[0].json}"
    assume = aws.data[("aws_iam_policy_document", "assume_scheduler")]["statement"][0]
    assert assume["principals"][0]["identifiers"] == ["scheduler.amazonaws.com"]
    assert assume["condition"][0]["variable"] == "aws:SourceAccount"
    assert (
        aws.resource("aws_scheduler_schedule", "this")["target"][0]["role_arn"]
        == "${aws_iam_role.scheduler[0].arn}"
    )


def test_logs_are_kept_for_a_bounded_time(aws: Module) -> None:
    log_group = aws.resource("aws_cloudwatch_log_group", "this")
    assert log_group["retention_in_days"] == "${var.log_retention_in_days}"
    assert aws.defaults()["log_retention_in_days"] > 0
    assert not accepts(aws, "log_retention_in_days", 0)
    logging = aws.resource("aws_lambda_function", "this")["logging_config"][0]
    assert logging["log_group"] == "${aws_cloudwatch_log_group.this[0].name}"


def test_image_repository_scans_and_expires(aws: Module) -> None:
    repo = aws.resource("aws_ecr_repository", "this")
    assert repo["image_scanning_configuration"][0]["scan_on_push"] is True
    assert aws.defaults()["ecr_image_tag_mutability"] == "IMMUTABLE"
    policy = json.loads(aws_eval(aws).value(aws.resource("aws_ecr_lifecycle_policy", "this")["policy"]))
    assert policy["rules"][0]["action"]["type"] == "expire"
    function = aws.resource("aws_lambda_function", "this")
    assert function["package_type"] == "Image"


def test_provisioned_concurrency_cannot_exceed_the_cap(aws: Module) -> None:
    config = aws.resource("aws_lambda_provisioned_concurrency_config", "this")
    [check] = preconditions(config)
    assert not aws_eval(aws, provisioned_concurrent_executions=5, reserved_concurrent_executions=4).value(
        check["condition"]
    )
    assert aws_eval(aws, provisioned_concurrent_executions=4, reserved_concurrent_executions=4).value(
        check["condition"]
    )


# -- Alibaba FC module --


def test_fc_http_trigger_is_never_anonymous(aliyun: Module) -> None:
    """FC's HTTP trigger authType is function or anonymous; the module allows function only."""
    trigger = aliyun.resource("alicloud_fcv3_trigger", "http")
    assert trigger["trigger_type"] == "http"
    assert aliyun.defaults()["http_auth_type"] == "function"
    assert accepts(aliyun, "http_auth_type", "function")
    for auth in ("anonymous", "jwt", "Function", ""):
        assert not accepts(aliyun, "http_auth_type", auth), auth
    config = json.loads(aliyun_eval(aliyun).value(trigger["trigger_config"]))
    assert config == {"authType": "function", "methods": ["GET", "POST", "HEAD"], "disableURLInternet": False}
    assert "http_auth_config" not in aliyun.variables


def test_fc_concurrency_cap_and_log_retention(aliyun: Module) -> None:
    assert "default" not in aliyun.variables["reserved_concurrency"]
    assert not accepts(aliyun, "reserved_concurrency", 0)
    cap = aliyun.resource("alicloud_fcv3_concurrency_config", "this")
    assert cap["reserved_concurrency"] == "${var.reserved_concurrency}"
    store = aliyun.resource("alicloud_log_store", "this")
    assert store["retention_period"] == "${var.log_retention_in_days}"
    assert aliyun.defaults()["log_retention_in_days"] > 0
    function = aliyun.resource("alicloud_fcv3_function", "this")
    assert function["log_config"][0]["logstore"] == "${alicloud_log_store.this[0].logstore_name}"
    [check] = preconditions(aliyun.resource("alicloud_fcv3_provision_config", "this"))
    assert not aliyun_eval(aliyun, provisioned_instances=3, instance_concurrency=4).value(check["condition"])


def test_fc_role_policy_is_scoped(aliyun: Module) -> None:
    document = aliyun.resource("alicloud_ram_policy", "this")["policy_document"]
    policy = json.loads(aliyun_eval(aliyun, signing_key_oss=KEY_OSS).value(document))
    by_action = {action: s["Resource"] for s in policy["Statement"] for action in s["Action"]}
    assert set(by_action) == {
        "log:PostLogStoreLogs",
        "cr:PullRepository",
        "cr:GetAuthorizationToken",
        "oss:GetObject",
        "oss:ListObjects",
    }
    assert by_action["log:PostLogStoreLogs"][0].endswith("/logstore/function")
    assert by_action["cr:PullRepository"][0].endswith(":repository/spillway/aliyun-fc")
    assert [a for a, r in by_action.items() if "*" in r] == ["cr:GetAuthorizationToken"]
    # The key's folder only: its objects, and a listing of the bucket under that prefix.
    objects = by_action["oss:GetObject"]
    assert all(r.startswith("acs:oss:*:") for r in objects)
    assert [r.rsplit(":", 1)[1] for r in objects] == [
        "spillway-keys/fn/add-sub/",
        "spillway-keys/fn/add-sub/*",
    ]
    [listing] = [s for s in policy["Statement"] if s["Action"] == ["oss:ListObjects"]]
    assert [r.rsplit(":", 1)[1] for r in listing["Resource"]] == ["spillway-keys"]
    assert listing["Condition"] == {"StringLike": {"oss:Prefix": ["fn/add-sub/", "fn/add-sub/*"]}}
    # Nothing on OSS (and nothing on KMS) without a key.
    default = json.loads(aliyun_eval(aliyun).value(document))
    assert not [a for s in default["Statement"] for a in s["Action"] if a.startswith(("oss:", "kms:"))]


def test_fc_signing_key_comes_only_from_the_read_only_oss_mount(aliyun: Module) -> None:
    assert "signing_key_secret_name" not in aliyun.variables
    assert aliyun.defaults()["signing_key_oss"] is None
    for name in SIGNING_KEY_ENV:
        assert not accepts(aliyun, "environment_variables", {name: "hunter2"}), name
    function = aliyun.resource("alicloud_fcv3_function", "this")
    assert function["environment_variables"] == "${local.environment}"
    [dyn] = [d["oss_mount_config"] for d in function["dynamic"] if "oss_mount_config" in d]
    assert "oss_mount_config" not in {k for k in function if k != "dynamic"}

    evaluator = aliyun_eval(aliyun)
    assert not any(name in evaluator.local("environment") for name in SIGNING_KEY_ENV)
    assert evaluator.value(dyn["for_each"]) == []

    evaluator = aliyun_eval(aliyun, signing_key_oss=KEY_OSS)
    env = evaluator.local("environment")
    assert [name for name in SIGNING_KEY_ENV if name in env] == ["SPILLWAY_SIGNING_KEY_FILE"]
    [item] = evaluator.value(dyn["for_each"])
    evaluator.scope["oss_mount_config"] = {"value": item}
    [content] = dyn["content"]
    [mount] = evaluator.value(content["mount_points"])
    assert mount["read_only"] is True
    assert mount["bucket_name"] == "spillway-keys"
    assert mount["bucket_path"] == "/fn/add-sub"
    assert mount["mount_dir"] == "/mnt/spillway-key"
    assert env["SPILLWAY_SIGNING_KEY_FILE"] == f"{mount['mount_dir']}/signing.key"
    region = evaluator.local("region")
    assert mount["endpoint"] == f"https://oss-{region}-internal.aliyuncs.com"
    beijing = "https://oss-cn-beijing.aliyuncs.com"
    custom = aliyun_eval(aliyun, signing_key_oss={**KEY_OSS, "endpoint": beijing})
    assert custom.local("signing_key_oss")["endpoint"] == beijing


@pytest.mark.parametrize(
    "change",
    [
        {"bucket": "Spillway_Keys"},
        {"bucket": "-keys"},
        {"object_dir": ""},
        {"object_dir": "/"},
        {"object_dir": "/fn"},
        {"object_dir": "fn/"},
        {"object_dir": "fn/../other"},
        {"file_name": "fn/signing.key"},
        {"file_name": ".."},
        {"file_name": ""},
        {"endpoint": "http://oss-cn-hangzhou-internal.aliyuncs.com"},
    ],
)
def test_fc_signing_key_oss_rejects_paths_outside_one_folder(aliyun: Module, change: dict[str, Any]) -> None:
    assert accepts(aliyun, "signing_key_oss", KEY_OSS)
    assert accepts(aliyun, "signing_key_oss", None)
    assert not accepts(aliyun, "signing_key_oss", {**KEY_OSS, **change})


@pytest.mark.parametrize(
    ("which", "variable"),
    [(which, variable) for which, table in PROVIDER_VALUES.items() for variable in table],
)
def test_validations_accept_what_the_provider_accepts_and_nothing_else(
    which: str, variable: str, request: Any
) -> None:
    module: Module = request.getfixturevalue("aws" if which == "aws_function" else "aliyun")
    good, bad = PROVIDER_VALUES[which][variable]
    assert [v for v in good if not accepts(module, variable, v)] == []
    assert [v for v in bad if accepts(module, variable, v)] == []


def test_permission_statement_ids_fit_lambda_whatever_the_role_path(aws: Module) -> None:
    """Statement ids are 1-100 letters, digits, '-' and '_', and must differ per principal."""
    principals = [
        LONG_ROLE,
        "arn:aws:iam::123456789012:user/ops.gateway",
        "arn:aws:iam::123456789012:user/ops-gateway",
        "arn:aws:iam::123456789012:role/other-path/ops-gateway",
        "123456789012",
    ]
    evaluator = aws_eval(aws, invoker_principal_arns=[*principals, principals[0]])
    grants = evaluator.local("invoker_principal")
    assert sorted(grants.values()) == sorted(principals)
    ids = []
    for name in ("invoke", "invoke_url"):
        for key, principal in grants.items():
            evaluator.scope["each"] = {"key": key, "value": principal}
            ids.append(evaluator.value(permissions(aws)[name]["statement_id"]))
    assert len(set(ids)) == len(ids) == 2 * len(principals)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,100}", i) for i in ids), ids


# -- the example and the gateway's targets --


TARGET_KEYS = {
    "name",
    "kind",
    "mode",
    "url",
    "function_name",
    "qualifier",
    "region",
    "concurrency_cap",
    "cold_start_ms",
}


def test_example_outputs_one_target_per_cloud(example: Module) -> None:
    assert example.outputs["spillway_targets"]["value"] == "${local.targets}"
    targets = example.evaluator().local("targets")
    assert [t["kind"] for t in targets] == ["aws_lambda", "aliyun_fc"]
    for target in targets:
        assert set(target) == TARGET_KEYS
        assert target["mode"] == "upstream"
        assert isinstance(target["cold_start_ms"], (int, float)) and target["cold_start_ms"] > 0
        assert isinstance(target["url"], Unknown)
    sources = {name: body["source"] for name, body in example.modules.items()}
    assert sources == {"aws": "../../modules/aws_function", "aliyun": "../../modules/aliyun_function"}
    readme = (TF / "examples" / "hybrid" / "README.md").read_text()
    assert (
        "terraform output -json spillway_targets | python -m gateway_plugin import-targets > targets.yaml"
        in readme
    )


def test_gateway_imports_the_targets_output(example: Module) -> None:
    """What `terraform output -json spillway_targets` prints is what `import-targets` accepts."""
    from gateway_plugin.targets_import import import_targets

    evaluator = example.evaluator()
    evaluator.scope["module"] = {
        "aws": {
            "function_url": "https://abc123.lambda-url.us-east-1.on.aws/",
            "function_name": "spillway-add-sub",
            "qualifier": "live",
            "reserved_concurrent_executions": 7,
        },
        "aliyun": {
            "http_trigger_url": "https://spillway-add-sub-abc.cn-hangzhou.fcapp.run",
            "function_name": "spillway-add-sub",
            "qualifier": "LATEST",
            "reserved_concurrency": example.defaults()["aliyun_reserved_concurrency"],
        },
    }
    targets = evaluator.local("targets")
    assert targets[1]["qualifier"] is None
    imported = yaml.safe_load(import_targets(json.dumps(targets)))["targets"]
    assert [(t["name"], t["kind"], t.get("mode", "upstream")) for t in imported] == [
        ("aws", "aws_lambda", "upstream"),
        ("aliyun", "aliyun_fc", "upstream"),
    ]
    assert imported[0]["url"] == "https://abc123.lambda-url.us-east-1.on.aws/"
    assert imported[0]["concurrency_cap"] == 7
    assert imported[1]["cold_start_ms"] == example.defaults()["aliyun_cold_start_ms"]


def test_every_variable_and_output_is_described(aws: Module, aliyun: Module, example: Module) -> None:
    for module in (aws, aliyun, example):
        for name, body in module.variables.items():
            assert body.get("description") and body.get("type"), f"{module.path.name}: variable {name}"
        for name, body in module.outputs.items():
            assert body.get("description"), f"{module.path.name}: output {name}"
    for module in (aws, aliyun, example):
        readme = (module.path / "README.md").read_text()
        for name in [*module.variables, *module.outputs]:
            assert f"| `{name}` |" in readme, f"{module.path.name}/README.md does not document {name}"
    for module in (aws, aliyun):
        for name, body in module.outputs.items():
            value = body["value"]
            assert "try(" in value or ("aws_" not in value and "alicloud_" not in value), (
                f"output {name} needs try()"
            )


# -- images --


def test_images_and_modules_agree_on_commands_and_paths(aliyun: Module) -> None:
    fc = dict(dockerfile_instructions(IMAGES / "aliyun-fc" / "Dockerfile")[::-1])
    assert exec_form(fc["CMD"]) == aliyun.defaults()["container_command"]
    assert exec_form(fc["CMD"]) == ["python", "-m", "functions", "serve", "--platform", "aliyun-fc"]
    assert exec_form(fc["ENTRYPOINT"]) == aliyun.defaults()["container_entrypoint"]
    assert fc["EXPOSE"] == "9000"
    assert aliyun.resource("alicloud_fcv3_function", "this")["custom_container_config"][0]["port"] == 9000
    lam = dict(dockerfile_instructions(IMAGES / "aws-lambda" / "Dockerfile")[::-1])
    assert exec_form(lam["ENTRYPOINT"]) == ["python", "-m", "awslambdaric"]
    [handler] = exec_form(lam["CMD"])
    module, func = handler.rsplit(".", 1)
    tree = ast.parse((ROOT / Path(*module.split("."))).with_suffix(".py").read_text())
    assert func in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for dockerfile in IMAGES.glob("*/Dockerfile"):
        steps = dockerfile_instructions(dockerfile)
        if dockerfile.parent.name != "gateway":  # the function images bake models; the gateway none
            assert any(i == "COPY" and a.endswith(f" {IMAGE_MODEL_REPOSITORY}") for i, a in steps), dockerfile
        assert [a for i, a in steps if i == "USER"][-1] not in ("root", "0", "0:0"), dockerfile
        stages = {"scratch"}
        # Bases are build arguments (a test builds the same recipe on stand-ins): their defaults are pinned.
        defaults = dict(a.split("=", 1) for i, a in steps if i == "ARG" and "=" in a)
        for instruction, args in steps:
            if instruction == "FROM":
                image, *alias = args.split()
                image = defaults.get(image.strip("${}"), image) if image.startswith("$") else image
                if image not in stages:
                    assert ":" in image and not image.endswith(":latest"), f"{dockerfile}: unpinned {image}"
                stages.update(alias[1:] if alias[:1] == ["AS"] else [])


def _dockerignored(path: str, patterns: list[str]) -> bool:
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        hit = any(fnmatch.fnmatchcase(p, pattern) for p in prefixes)
        if pattern.startswith("**/"):
            hit = hit or any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts)
        if hit:
            excluded = not negate
    return excluded


def test_dockerignore_keeps_what_the_images_copy() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]
    for excluded in (".venv", ".git", "tests", "bench", ".cache", "functions/__pycache__"):
        assert _dockerignored(excluded, patterns), excluded
    for dockerfile in IMAGES.glob("*/Dockerfile"):
        steps = dockerfile_instructions(dockerfile)
        args = {a.split("=", 1)[0]: a.split("=", 1)[1] for i, a in steps if i == "ARG" and "=" in a}
        for instruction, line in steps:
            if instruction != "COPY" or line.startswith("--from"):
                continue
            sources = [s for s in line.split()[:-1] if not s.startswith("--")]
            for source in sources:
                source = args.get(source.strip("${}"), source) if source.startswith("$") else source
                assert (ROOT / source).exists(), f"{dockerfile}: COPY {source} is missing"
                assert not _dockerignored(source, patterns), (
                    f"{dockerfile}: COPY {source} is in .dockerignore"
                )


def test_constraints_pin_every_image_package() -> None:
    pins = {}
    for line in (IMAGES / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"unpinned: {line}"
            pins[name.lower().replace("_", "-")] = version
    assert pins["numpy"].startswith("1."), "Triton 2.51's Python backend needs numpy < 2"
    assert pins["awslambdaric"] == "4.2.2"
    for name in ("httptools", "uvloop", "tritonclient", "pydantic", "setuptools"):
        assert name in pins


def test_fc_image_readme_names_only_drivers_triton_supports() -> None:
    """Triton 24.10 (CUDA 12.6) runs on data-centre drivers R470, R525, R535 or R545 through CUDA
    forward compatibility, or on 560 and newer."""
    readme = (IMAGES / "README.md").read_text()
    section = readme.split("## GPU driver and CUDA on FC", 1)[1].split("\n## ", 1)[0]
    branches = {int(b) for b in re.findall(r"\bR?(\d{3})\b", section)}
    assert branches, section
    assert all(b in (470, 525, 535, 545) or b >= 560 for b in branches), branches


@pytest.mark.parametrize(
    ("driver_line", "uses_compat"),
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.07  Sat Feb 17 22:55:48 UTC 2024", True),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  545.23.08  Release Build", True),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu Jan 23 21:33:15 UTC 2025", False),
        (None, False),
    ],
)
def test_fc_entrypoint_uses_cuda_compat_only_on_older_drivers(
    tmp_path: Path, driver_line: str | None, uses_compat: bool
) -> None:
    compat = tmp_path / "compat" / "lib.real"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.560.35.03").touch()
    driver = tmp_path / "version"
    if driver_line is not None:
        driver.write_text(driver_line + "\n")
    env = {
        "PATH": os.environ["PATH"],
        "LD_LIBRARY_PATH": "/opt/tritonserver/lib",
        "SPILLWAY_CUDA_COMPAT_DIR": str(compat),
        "SPILLWAY_DRIVER_VERSION_FILE": str(driver),
    }
    out = subprocess.run(
        ["sh", str(IMAGES / "aliyun-fc" / "entrypoint.sh"), "sh", "-c", 'printf %s "$LD_LIBRARY_PATH"'],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    assert out == (f"{compat}:/opt/tritonserver/lib" if uses_compat else "/opt/tritonserver/lib")


# -- the /dev/shm shim of the Lambda image --


@pytest.fixture(scope="module")
def shm_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build images/aws-lambda/shm_redirect.c")
    out = tmp_path_factory.mktemp("shim") / "libspillway_shm.so"
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(out),
            str(IMAGES / "aws-lambda" / "shm_redirect.c"),
            "-ldl",
        ],
        check=True,
        timeout=60,
    )
    return out


SHM_PROBE = """
import os, sys
from multiprocessing import shared_memory
m = shared_memory.SharedMemory(name="spillway_probe", create=True, size=4096)
m.buf[:5] = b"hello"
other = shared_memory.SharedMemory(name="spillway_probe")
assert bytes(other.buf[:5]) == b"hello"
listing = sorted(os.listdir(sys.argv[1])) if os.path.isdir(sys.argv[1]) else []
other.close(); m.close(); m.unlink()
after = sorted(os.listdir(sys.argv[1])) if os.path.isdir(sys.argv[1]) else []
print(listing, after)
"""


def test_shim_moves_posix_shared_memory_out_of_dev_shm(shm_shim: Path, tmp_path: Path) -> None:
    shm_dir = tmp_path / "shm"
    env = {
        **os.environ,
        "LD_PRELOAD": str(shm_shim),
        "SPILLWAY_SHM_DIR": str(shm_dir),
        "SPILLWAY_SHM_DIR_FORCE": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", SHM_PROBE, str(shm_dir)], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['spillway_probe'] []"
    assert not Path("/dev/shm/spillway_probe").exists()


def test_shim_passes_through_where_dev_shm_works(shm_shim: Path, tmp_path: Path) -> None:
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("/dev/shm is not writable here")
    shm_dir = tmp_path / "shm"
    env = {**os.environ, "LD_PRELOAD": str(shm_shim), "SPILLWAY_SHM_DIR": str(shm_dir)}
    out = subprocess.run(
        [sys.executable, "-c", SHM_PROBE, str(shm_dir)], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []"


def _lambda_triton_layout(tmp: Path, shim: Path) -> Path:
    """/opt/tritonserver of the Lambda image, laid out as its Dockerfile does, under ``tmp``."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    bundle, libs = purelib / "pytriton" / "tritonserver", purelib / "nvidia_pytriton.libs"
    if not (bundle / "bin" / "tritonserver").exists():
        pytest.skip("the nvidia-pytriton wheel (spillway[triton]) is not installed")
    tree = tmp / "tritonserver"
    for part in ("bin", "caches"):
        shutil.copytree(bundle / part, tree / part)
    shutil.copytree(bundle / "backends" / "python", tree / "backends" / "python")
    stub = (
        bundle
        / "python_backend_stubs"
        / f"{sys.version_info.major}.{sys.version_info.minor}"
        / "triton_python_backend_stub"
    )
    shutil.copy2(stub, tree / "backends" / "python")
    shutil.copytree(libs, tree / "lib", ignore=shutil.ignore_patterns("libpython3-*"))
    shutil.copy2(shim, tree / "lib" / "libspillway_shm.so")
    return tree


@pytest.mark.integration
def test_lambda_layout_serves_python_models_without_dev_shm(shm_shim: Path, tmp_path: Path) -> None:
    """Lambda mounts no /dev/shm: with the image's layout and shim, add_sub still loads and answers."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to hide /dev/shm in a private mount namespace")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode != 0:
        pytest.skip("mount namespaces are not available here")
    tree = _lambda_triton_layout(tmp_path, shm_shim)
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "LD_LIBRARY_PATH": f"{tree / 'lib'}:{sysconfig.get_config_var('LIBDIR')}",
        "LD_PRELOAD": str(tree / "lib" / "libspillway_shm.so"),
        "SPILLWAY_SHM_DIR": str(tmp_path / "shm"),
        "HOME": str(tmp_path),
    }
    usage = subprocess.run(
        [str(tree / "bin" / "tritonserver"), "--help"], env=env, capture_output=True, text=True, timeout=30
    )
    assert "Default is '/opt/tritonserver/backends'" in usage.stdout + usage.stderr, (
        "the image relies on this default"
    )
    port, grpc, metrics = free_port(), free_port(), free_port()
    server = (
        f"mount -t tmpfs -o ro,size=4k tmpfs /dev/shm && exec {tree}/bin/tritonserver"
        f" --model-repository={model_repository(tmp_path, 'add_sub')} --backend-directory={tree}/backends"
        f" --cache-directory={tree}/caches --http-port={port} --grpc-port={grpc} --metrics-port={metrics}"
    )
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", server],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(
                    (proc.stdout.read() if proc.stdout else b"").decode(errors="replace")[-3000:]
                )
            try:
                return urllib.request.urlopen(f"{base}/v2/health/ready", timeout=1).status == 200
            except OSError:
                return False

        wait_until(ready, 60, "tritonserver without /dev/shm")
        assert os.listdir(tmp_path / "shm"), "the Python backend's region should live in SPILLWAY_SHM_DIR"
        request = urllib.request.Request(f"{base}/v2/models/add_sub/infer", data=ADD_SUB_BODY, method="POST")
        answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
        outputs = {o["name"]: o["data"] for o in answer["outputs"]}
        assert outputs == {"OUTPUT0": [11.0, 22.0, 33.0, 44.0], "OUTPUT1": [-9.0, -18.0, -27.0, -36.0]}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the static checks themselves --


def test_check_infra_script_passes() -> None:
    if shutil.which("terraform") is None:
        pytest.skip("terraform is not installed (scripts/check-infra.sh needs it)")
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check-infra.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
