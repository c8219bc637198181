"""Function settings from the environment: defaults, bad values named, one key source only."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.settings import FunctionSettings, SettingsError
from tests.support import EXAMPLE_MODELS


def settings(**env: str) -> FunctionSettings:
    return FunctionSettings.from_env({"SPILLWAY_MODEL_REPOSITORY": str(EXAMPLE_MODELS), **env})


def test_defaults_discover_models_and_sign_nothing() -> None:
    s = settings()
    assert s.models == ("add_sub",) and s.signing_key is None and s.max_body_bytes == 32 * 1024 * 1024


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"SPILLWAY_READY_TIMEOUT_S": "soon"}, "SPILLWAY_READY_TIMEOUT_S='soon' is not a number"),
        ({"SPILLWAY_MAX_BODY_BYTES": "-1"}, "greater than zero"),
        ({"SPILLWAY_ALLOW_UNSIGNED_PAYLOAD": "maybe"}, "not a boolean"),
        ({"SPILLWAY_SIGNING_KEY": "a", "SPILLWAY_SIGNING_KEY_FILE": "/x"}, "only one of"),
        ({"SPILLWAY_SIGNING_KEY_FILE": "/nonexistent/key"}, "No such file"),
        ({"SPILLWAY_SIGNING_KEY_SECRET_NAME": "spillway"}, "refusing to start without the signature check"),
        ({"SPILLWAY_MODEL_REPOSITORY": "/nonexistent"}, "is not a directory"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(env: dict[str, str], words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        settings(**env)


def test_key_from_a_file(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    assert settings(SPILLWAY_SIGNING_KEY_FILE=str(key)).signing_key == b"s3cret"
