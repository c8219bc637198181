"""infra/terraform checked by Terraform itself, offline, on a provider-free rendering
(scripts/tf_render.py): its type checks, variable validations, preconditions and plans."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from functions.contract import warmup_payload
from scripts.tf_offline import (
    UNKNOWN,
    TerraformFailed,
    Workspace,
    cases_root,
    check,
    planned_inputs,
    planned_outputs,
    terraform_binary,
)
from testing.terraform import LONG_ROLE, PROVIDER_VALUES, load_module

ROOT = Path(__file__).resolve().parents[2]
TF = ROOT / "infra" / "terraform"
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:spillway-key-AbCdEf"
GATEWAY = "arn:aws:iam::123456789012:role/spillway-gateway"
KEY_OSS = {"bucket": "spillway-keys", "object_dir": "fn/add-sub", "file_name": "signing.key"}
REQUIRED = {
    "aws_function": {"name": "fn", "reserved_concurrent_executions": 4},
    "aliyun_function": {
        "name": "fn",
        "reserved_concurrency": 8,
        "image": "registry-vpc.cn-hangzhou.aliyuncs.com/spillway/aliyun-fc:0.1.0",
    },
}
# Known values for the data sources, so that what depends on region and account is known too.
DATA = {
    "modules/aws_function": {
        "aws_region.current": {"region": "us-east-1"},
        "aws_caller_identity.current": {"account_id": "123456789012"},
    },
    "modules/aliyun_function": {
        "alicloud_regions.current": {"regions": [{"id": "cn-hangzhou"}]},
        "alicloud_account.current": {"id": "1234567890123456"},
    },
}

pytestmark = pytest.mark.skipif(terraform_binary() is None, reason="terraform is not installed")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(TF, tmp_path_factory.mktemp("rendered"), DATA)


def plan_cases(workspace: Workspace, module: str, cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One plan of a root calling ``module`` once per case (the required inputs added)."""
    inputs = {case: {**REQUIRED[module], **values} for case, values in cases.items()}
    root = cases_root(workspace.dest, f"{module}-{'-'.join(cases)}", f"modules/{module}", inputs)
    return workspace.plan(root)


@pytest.fixture(scope="module")
def aws_plan(workspace: Workspace) -> dict[str, Any]:
    none = {"function_url_authorization_type": "NONE", "signing_key_secret_arn": SECRET_ARN}
    return plan_cases(
        workspace,
        "aws_function",
        {
            "iam": {"invoker_principal_arns": [GATEWAY]},
            "none": {**none, "invoker_principal_arns": [GATEWAY]},
            "none_unaliased": {**none, "create_alias": False},
            "cold": {"warmup_pings": 0},
            "streaming": {"invoke_mode": "RESPONSE_STREAM"},
            "many": {
                "invoker_principal_arns": [
                    LONG_ROLE,
                    "arn:aws:iam::123456789012:user/ops.gateway",
                    "arn:aws:iam::123456789012:user/ops-gateway",
                    "123456789012",
                ]
            },
            "off": {"create": False, "invoker_principal_arns": [GATEWAY]},
        },
    )


@pytest.fixture(scope="module")
def aliyun_plan(workspace: Workspace) -> dict[str, Any]:
    return plan_cases(
        workspace,
        "aliyun_function",
        {"keyless": {}, "key": {"signing_key_oss": KEY_OSS}, "off": {"create": False}},
    )


def inputs(plan: dict[str, Any], case: str, resource: str) -> list[Any]:
    """Planned arguments of each instance of a resource (``type.name``) in one case."""
    kind, name = resource.split(".")
    rendered = f"r__{kind}__{name}"
    return planned_inputs(plan, f"module.{case}.terraform_data.{rendered}")


# The RAM statements for the signing key written as one conditional: its results, no statements
# and two statements of different shapes, are tuples of different types.
MISMATCHED_CONDITIONAL = """      local.signing_key_oss == null ? [] : [
        {
          Effect   = "Allow"
          Action   = ["oss:GetObject"]
          Resource = ["${local.signing_key_oss.bucket_arn}/${local.signing_key_oss.prefix}*"]
        },
        {
          Effect    = "Allow"
          Action    = ["oss:ListObjects"]
          Resource  = [local.signing_key_oss.bucket_arn]
          Condition = { StringLike = { "oss:Prefix" = [local.signing_key_oss.prefix] } }
        },
      ],
"""


def write_mismatched_conditional(tree: Path) -> int:
    """Put MISMATCHED_CONDITIONAL into the FC role policy of a copy of infra/terraform; its line."""
    main = tree / "modules" / "aliyun_function" / "main.tf"
    text = main.read_text()
    anchor = "      local.signing_key_statements,\n"
    assert text.count(anchor) == 1, "the FC role policy no longer ends with the key statements"
    main.write_text(text.replace(anchor, MISMATCHED_CONDITIONAL))
    return text[: text.index(anchor)].count("\n") + 1


def test_offline_terraform_accepts_every_module_and_example() -> None:
    assert check(TF) == []


def test_offline_check_rejects_a_conditional_whose_results_differ_in_type(tmp_path: Path) -> None:
    tree = tmp_path / "terraform"
    shutil.copytree(TF, tree, ignore=shutil.ignore_patterns(".terraform*"))
    line = write_mismatched_conditional(tree)
    problems = check(tree)
    assert problems
    for problem in problems:
        assert "Inconsistent conditional result types" in problem, problem
        assert f"modules/aliyun_function/main.tf:{line}:" in problem, problem
    # The module as a root, and the example through its module call.
    assert {p.split(":", 1)[0] for p in problems} == {
        "validate modules/aliyun_function",
        "validate examples/hybrid",
    }


def test_check_infra_script_fails_on_a_conditional_whose_results_differ_in_type(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for part in ("scripts", "infra", "images"):
        ignore = shutil.ignore_patterns(".terraform*", "__pycache__")
        shutil.copytree(ROOT / part, repo / part, ignore=ignore)
    shutil.copy2(ROOT / "requirements-infra.txt", repo / "requirements-infra.txt")
    if (ROOT / ".venv").exists():
        (repo / ".venv").symlink_to(ROOT / ".venv")
    write_mismatched_conditional(repo / "infra" / "terraform")
    env = {**os.environ, "SPILLWAY_INFRA_VENV": str(ROOT / ".cache" / "infra-venv")}
    result = subprocess.run(
        ["bash", str(repo / "scripts" / "check-infra.sh")],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "Inconsistent conditional result types" in result.stderr
    assert "check-infra: FAILED: Terraform rejects infra/terraform" in result.stderr


# -- validations, as Terraform evaluates them, against what the providers accept --


@pytest.mark.parametrize("module", sorted(PROVIDER_VALUES))
def test_terraform_validations_accept_what_the_provider_accepts_and_nothing_else(
    workspace: Workspace, module: str
) -> None:
    table = [
        (variable, value, rejected)
        for variable, (good, bad) in PROVIDER_VALUES[module].items()
        for rejected, values in ((False, good), (True, bad))
        for value in values
    ]
    cases = {f"c{i}": {**REQUIRED[module], variable: value} for i, (variable, value, _) in enumerate(table)}
    root = cases_root(workspace.dest, f"{module}-validations", f"modules/{module}", cases)
    found: dict[str, set[str]] = {case: set() for case in cases}
    for diagnostic in workspace.validate(root):
        assert diagnostic.summary == "Invalid value for variable", diagnostic
        case = diagnostic.context.split('"')[1]
        found[case].add(diagnostic.code.split("=")[0].strip())
    wrong = [
        (variable, value)
        for i, (variable, value, rejected) in enumerate(table)
        if found[f"c{i}"] != ({variable} if rejected else set())
    ]
    assert wrong == []


# -- the AWS function URL, retries and statement ids, as planned --


def test_planned_none_url_grants_anyone_invoke_through_the_url_only(aws_plan: dict[str, Any]) -> None:
    public = {
        "statement_id": "SpillwayPublicUrlInvoke",
        "action": "lambda:InvokeFunction",
        "function_name": UNKNOWN,
        "qualifier": "live",
        "principal": "*",
        "invoked_via_function_url": True,
    }
    assert inputs(aws_plan, "none", "aws_lambda_permission.public_url") == [public]
    assert inputs(aws_plan, "none_unaliased", "aws_lambda_permission.public_url") == [
        {**public, "qualifier": None}
    ]
    [url] = inputs(aws_plan, "none", "aws_lambda_function_url.this")
    assert (url["authorization_type"], url["qualifier"]) == ("NONE", "live")
    assert inputs(aws_plan, "none", "terraform_data.url_authorization_type") == [{"input": "NONE"}]
    # No IAM URL grants for a NONE URL; the gateway keeps Invoke.
    assert inputs(aws_plan, "none", "aws_lambda_permission.invoke_url") == []
    [invoke] = inputs(aws_plan, "none", "aws_lambda_permission.invoke")
    assert (invoke["action"], invoke["principal"]) == ("lambda:InvokeFunction", GATEWAY)


def test_planned_iam_url_grants_its_callers_both_url_actions(aws_plan: dict[str, Any]) -> None:
    assert inputs(aws_plan, "iam", "aws_lambda_permission.public_url") == []
    [url] = inputs(aws_plan, "iam", "aws_lambda_function_url.this")
    assert url["authorization_type"] == "AWS_IAM"
    [invoke_url] = inputs(aws_plan, "iam", "aws_lambda_permission.invoke_url")
    [invoke] = inputs(aws_plan, "iam", "aws_lambda_permission.invoke")
    assert invoke_url["action"] == "lambda:InvokeFunctionUrl"
    assert invoke_url["function_url_auth_type"] == "AWS_IAM"
    assert invoke["action"] == "lambda:InvokeFunction"
    assert "invoked_via_function_url" not in invoke
    assert invoke_url["principal"] == invoke["principal"] == GATEWAY
    assert invoke_url["qualifier"] == invoke["qualifier"] == url["qualifier"] == "live"


def test_a_streaming_url_runs_the_images_streaming_runtime(aws_plan: dict[str, Any]) -> None:
    """RESPONSE_STREAM needs a runtime that streams: awslambdaric answers whole."""
    [url] = inputs(aws_plan, "streaming", "aws_lambda_function_url.this")
    assert url["invoke_mode"] == "RESPONSE_STREAM"
    [function] = inputs(aws_plan, "streaming", "aws_lambda_function.this")
    assert function["image_config"] == [
        {"entry_point": ["python", "-m", "functions", "lambda-runtime"], "command": []}
    ]
    [buffered] = inputs(aws_plan, "iam", "aws_lambda_function.this")
    assert buffered["image_config"] == [], "the image's own entrypoint (awslambdaric)"
    assert inputs(aws_plan, "iam", "aws_lambda_function_url.this")[0]["invoke_mode"] == "BUFFERED"


def test_plan_refuses_a_none_url_without_a_signing_secret(workspace: Workspace) -> None:
    with pytest.raises(TerraformFailed) as failure:
        plan_cases(workspace, "aws_function", {"open": {"function_url_authorization_type": "NONE"}})
    [error] = failure.value.diagnostics
    assert error.summary == "Resource precondition failed"
    assert "set signing_key_secret_arn" in error.detail
    assert error.where.endswith(("modules/aws_function/url.tf:14", "modules/aws_function/url.tf:15"))


def test_planned_pings_are_not_retried(aws_plan: dict[str, Any]) -> None:
    config = "aws_lambda_function_event_invoke_config.this"
    assert inputs(aws_plan, "iam", config) == [
        {
            "function_name": UNKNOWN,
            "qualifier": "live",
            "maximum_retry_attempts": 0,
            "maximum_event_age_in_seconds": 60,
        }
    ]
    [schedule] = inputs(aws_plan, "iam", "aws_scheduler_schedule.this")
    assert schedule["target"][0]["retry_policy"][0]["maximum_retry_attempts"] == 0
    assert inputs(aws_plan, "cold", config) == inputs(aws_plan, "cold", "aws_scheduler_schedule.this") == []


def test_planned_statement_ids_fit_lambda_whatever_the_role_path(aws_plan: dict[str, Any]) -> None:
    ids = [
        grant["statement_id"]
        for resource in ("aws_lambda_permission.invoke", "aws_lambda_permission.invoke_url")
        for grant in inputs(aws_plan, "many", resource)
    ]
    assert len(ids) == len(set(ids)) == 8
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,100}", i) for i in ids), ids


# -- the FC role policy, as planned --


def test_planned_fc_role_policy_reads_the_key_folder_only_when_there_is_a_key(
    aliyun_plan: dict[str, Any],
) -> None:
    def statements(case: str) -> list[dict[str, Any]]:
        [policy] = inputs(aliyun_plan, case, "alicloud_ram_policy.this")
        assert re.fullmatch(r"[A-Za-z0-9-]{1,128}", policy["policy_name"]), policy["policy_name"]
        document: dict[str, Any] = json.loads(policy["policy_document"])
        return list(document["Statement"])

    keyless, key = statements("keyless"), statements("key")
    assert key[: len(keyless)] == keyless
    assert not [s for s in keyless for a in s["Action"] if a.startswith("oss:")]
    assert key[len(keyless) :] == [
        {
            "Effect": "Allow",
            "Action": ["oss:GetObject"],
            "Resource": [
                "acs:oss:*:1234567890123456:spillway-keys/fn/add-sub/",
                "acs:oss:*:1234567890123456:spillway-keys/fn/add-sub/*",
            ],
        },
        {
            "Effect": "Allow",
            "Action": ["oss:ListObjects"],
            "Resource": ["acs:oss:*:1234567890123456:spillway-keys"],
            "Condition": {"StringLike": {"oss:Prefix": ["fn/add-sub/", "fn/add-sub/*"]}},
        },
    ]
    [role] = inputs(aliyun_plan, "key", "alicloud_ram_role.this")
    assert re.fullmatch(r"[A-Za-z0-9.-]{1,64}", role["role_name"]), role["role_name"]


# -- outputs without create --


@pytest.mark.parametrize("module", ["aws_function", "aliyun_function"])
def test_every_output_is_null_or_empty_without_create(module: str, request: pytest.FixtureRequest) -> None:
    plan = request.getfixturevalue("aws_plan" if module == "aws_function" else "aliyun_plan")
    outputs = planned_outputs(plan)
    off = outputs["off"]
    assert set(off) == set(load_module(TF / "modules" / module).outputs)
    assert {name: value for name, value in off.items() if value not in (None, [])} == {}
    assert created(plan, "off") == []
    # The same outputs are set when the module creates the function.
    on = outputs["iam" if module == "aws_function" else "keyless"]
    payload = warmup_payload(dwell_ms=250, models=("add_sub",), probe=False)
    if module == "aws_function":
        expected = {"qualifier": "live", "region": "us-east-1", "warmup_payload": payload}
    else:
        expected = {"qualifier": "LATEST", "http_auth_type": "function", "region": "cn-hangzhou"}
        expected["warmup_payload"] = payload
    assert {name: on[name] for name in expected} == expected


def created(plan: dict[str, Any], case: str) -> list[str]:
    """Addresses of the resources (data sources aside) one case would create."""
    prefix = f"module.{case}.terraform_data.r__"
    return [c["address"] for c in plan.get("resource_changes", []) if c["address"].startswith(prefix)]
