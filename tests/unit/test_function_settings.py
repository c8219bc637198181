"""Function settings from the environment: defaults, bad values named, one key source only."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.settings import FunctionSettings, SettingsError
from testing.paths import EXAMPLE_MODELS


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
        ({"SPILLWAY_SIGNING_KEY": "   "}, "blank signing key"),
        ({"SPILLWAY_SIGNING_KEY": "\t\n"}, "blank signing key"),
        ({"SPILLWAY_HEADER_TIMEOUT_S": "nan"}, "finite"),
        ({"SPILLWAY_MAX_CONNECTIONS": "inf"}, "finite"),
        ({"SPILLWAY_MAX_HEADERS": "10.5"}, "whole number"),
        ({"SPILLWAY_TRITON_ENV": "HF_HOME,SPILLWAY_SIGNING_KEY"}, "never reaches Triton"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(env: dict[str, str], words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        settings(**env)


def test_key_from_a_file(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    assert settings(SPILLWAY_SIGNING_KEY_FILE=str(key)).signing_key == b"s3cret"


def test_http_limits_have_safe_defaults_and_can_be_set() -> None:
    defaults = settings().http
    assert (defaults.max_header_bytes, defaults.header_timeout_s, defaults.max_connections) == (
        65536,
        10,
        1024,
    )
    tuned = settings(SPILLWAY_MAX_HEADER_BYTES="8192", SPILLWAY_IDLE_TIMEOUT_S="5").http
    assert (tuned.max_header_bytes, tuned.idle_timeout_s) == (8192, 5)


def test_triton_gets_only_what_it_needs_and_what_the_operator_names() -> None:
    from functions.sidecar import triton_environment

    env = {
        "PATH": "/bin",
        "LD_PRELOAD": "/shim.so",
        "CUDA_VISIBLE_DEVICES": "0",
        "HF_HOME": "/models/hf",
        "SPILLWAY_SIGNING_KEY": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_SESSION_TOKEN": "t",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "a",
        "FC_ACCESS_KEY_SECRET": "f",
    }
    kept = triton_environment(
        env, {"LD_LIBRARY_PATH": "/triton/lib"}, settings(SPILLWAY_TRITON_ENV="HF_HOME").triton_env
    )
    assert kept == {
        "PATH": "/bin",
        "LD_PRELOAD": "/shim.so",
        "CUDA_VISIBLE_DEVICES": "0",
        "HF_HOME": "/models/hf",
        "LD_LIBRARY_PATH": "/triton/lib",
    }


def test_triton_listens_on_the_sidecars_host_and_a_host_that_is_no_address_is_refused() -> None:
    """Loopback by default (a function's Triton is reached only through its handler); another
    address where tests run several tritonservers with the same ports, as a Service's pods do."""
    from functions.sidecar import Sidecar, SidecarOptions
    from functions.triton_install import TritonInstall

    def listens(**options: str) -> list[str]:
        sidecar = Sidecar(
            SidecarOptions(EXAMPLE_MODELS, metrics_port=8002, **options), TritonInstall(Path("t"))
        )
        return [a for a in sidecar._command()[0] if a.startswith(("--http-address", "--metrics-address"))]

    assert listens() == ["--http-address=127.0.0.1", "--metrics-address=127.0.0.1"]
    assert listens(host="127.0.0.3") == ["--http-address=127.0.0.3", "--metrics-address=127.0.0.3"]
    with pytest.raises(ValueError, match=r"sidecar host 'triton\.local' is not an IP address"):
        SidecarOptions(EXAMPLE_MODELS, host="triton.local")
