"""What the Terraform modules set on the function is what the function reads: every environment
variable either module can set has a check here that the function reads it (changing the value
changes what the function does), and the Secrets Manager key path works under the official Lambda
emulator. The images run with the modules' own environment too (tests/integration/test_images_*.py), which is
where the `function` extra's dependency set meets this path."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from functions.settings import IMAGE_MODEL_REPOSITORY, FunctionSettings
from functions.signature import sign
from testing.function import ADD_SUB_BODY, http_event, invoke, lambda_emulator, model_repository
from testing.images import terraform_environment
from testing.paths import ROOT
from testing.secrets_manager import Secret, secrets_manager

KEY = "secret-from-the-stand-in-0123456789"
KEY_OSS = {"bucket": "keys", "object_dir": "fn", "file_name": "signing.key", "endpoint": None}


@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secret]:
    with secrets_manager(tmp_path_factory.mktemp("moto"), "spillway/key", KEY) as held:
        yield held


def module_environments(secret_arn: str) -> dict[str, dict[str, str]]:
    """Each module's environment with every option that adds a variable turned on."""
    return {
        "aws_function": terraform_environment(
            "aws_function", signing_key_secret_arn=secret_arn, allow_unsigned_payload=True
        ),
        "aliyun_function": terraform_environment("aliyun_function", signing_key_oss=KEY_OSS),
    }


Check = Callable[[str, Path, Secret, pytest.MonkeyPatch], None]


def settings(repo: Path, **env: str) -> FunctionSettings:
    return FunctionSettings.from_env({"SPILLWAY_MODEL_REPOSITORY": str(repo), **env})


def check_models(value: str, repo: Path, secret: Secret, mp: pytest.MonkeyPatch) -> None:
    assert settings(repo).models == ("add_sub", "slow")
    assert settings(repo, SPILLWAY_MODELS=value).models == tuple(value.split(","))


def check_repository(value: str, repo: Path, secret: Secret, mp: pytest.MonkeyPatch) -> None:
    assert value == IMAGE_MODEL_REPOSITORY, "the images bake the models there"
    assert FunctionSettings.from_env({"SPILLWAY_MODEL_REPOSITORY": str(repo)}).model_repository == repo


def check_unsigned(value: str, repo: Path, secret: Secret, mp: pytest.MonkeyPatch) -> None:
    assert settings(repo, SPILLWAY_ALLOW_UNSIGNED_PAYLOAD=value).allow_unsigned_payload is (value == "1")
    assert settings(repo, SPILLWAY_ALLOW_UNSIGNED_PAYLOAD="0").allow_unsigned_payload is False


def check_secret_arn(value: str, repo: Path, secret: Secret, mp: pytest.MonkeyPatch) -> None:
    for name, setting in secret.function_env().items():
        mp.setenv(name, setting)
    assert settings(repo, SPILLWAY_SIGNING_KEY_SECRET_ARN=value).signing_key == KEY.encode()


def check_key_file(value: str, repo: Path, secret: Secret, mp: pytest.MonkeyPatch) -> None:
    assert value.startswith("/mnt/spillway-key/"), "the read-only OSS mount"
    key = repo.parent / Path(value).name
    key.write_text("key from the mounted file\n")
    assert settings(repo, SPILLWAY_SIGNING_KEY_FILE=str(key)).signing_key == b"key from the mounted file"


READ_BY_THE_FUNCTION: dict[str, Check] = {
    "SPILLWAY_MODELS": check_models,
    "SPILLWAY_MODEL_REPOSITORY": check_repository,
    "SPILLWAY_ALLOW_UNSIGNED_PAYLOAD": check_unsigned,
    "SPILLWAY_SIGNING_KEY_SECRET_ARN": check_secret_arn,
    "SPILLWAY_SIGNING_KEY_FILE": check_key_file,
}


def test_every_variable_the_modules_set_is_read_by_the_function(
    secret: Secret, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = model_repository(tmp_path, "add_sub", "slow")
    environments = module_environments(secret.arn)
    for module, environment in environments.items():
        unchecked = set(environment) - set(READ_BY_THE_FUNCTION)
        assert not unchecked, f"{module} sets {unchecked}: add a check that the function reads each"
        for name, value in environment.items():
            with monkeypatch.context() as mp:
                READ_BY_THE_FUNCTION[name](value, repo, secret, mp)
    assert set().union(*environments.values()) == set(READ_BY_THE_FUNCTION), "a check for nothing"


def test_the_function_extra_carries_what_the_secrets_manager_path_imports() -> None:
    """settings._aws_secret imports boto3; the images install only the `function` extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {
        req.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip() for req in extras["function"]
    }
    assert "boto3" in names


@pytest.mark.integration
def test_lambda_reads_its_key_from_secrets_manager_at_init(
    secret: Secret, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """As the Terraform module deploys it: a signed request is answered, an unsigned one refused."""
    tmp = tmp_path_factory.mktemp("lambda-secret")
    env = {
        **terraform_environment("aws_function", signing_key_secret_arn=secret.arn),
        **secret.function_env(),
    }
    env["SPILLWAY_MODEL_REPOSITORY"] = str(model_repository(tmp, "add_sub"))
    with lambda_emulator(Path(env["SPILLWAY_MODEL_REPOSITORY"]), tmp, **env) as lam:
        target = "/v2/models/add_sub/infer"
        signature = sign(KEY.encode(), "POST", target, ADD_SUB_BODY)
        answered = invoke(lam, http_event("POST", target, ADD_SUB_BODY, {"x-spillway-signature": signature}))
        assert answered["statusCode"] == 200, answered
        assert json.loads(answered["body"])["outputs"][0]["data"] == [11, 22, 33, 44]
        refused = invoke(lam, http_event("POST", target, ADD_SUB_BODY))
        assert refused["statusCode"] == 401 and "missing" in json.loads(refused["body"])["error"]
