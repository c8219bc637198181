"""Which requests a function forwards to Triton: the allow-list, on normalised paths."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from functions import surface
from functions.contract import normalise_path
from functions.surface import check, is_v2


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/v2/models/m/infer", "/v2/models/m/infer"),
        ("//v2/repository", "/v2/repository"),
        ("/v2/./repository", "/v2/repository"),
        ("/v2/%72epository", "/v2/repository"),
        ("/v2/%2572epository", "/v2/repository"),
        ("/v2/models/../repository", "/v2/repository"),
        ("/../../v2/x/", "/v2/x"),
        ("/v2/models/a%2Fb/infer", "/v2/models/a/b/infer"),
        ("", "/"),
    ],
)
def test_paths_normalise_as_the_function_resolves_them(raw: str, normal: str) -> None:
    assert normalise_path(raw) == normal


@given(st.text(alphabet="/.%25%2e%2f%72v2repositorymodels", max_size=60))
def test_normal_form_is_stable_and_has_no_dot_segments(raw: str) -> None:
    normal = normalise_path(raw)
    assert normalise_path(normal) == normal
    assert normal.startswith("/") and "//" not in normal
    assert all(segment not in (".", "..") for segment in normal.split("/"))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2"),
        ("GET", "/v2/health/live"),
        ("GET", "/v2/health/ready"),
        ("GET", "/v2/models/add_sub"),
        ("GET", "/v2/models/add_sub/ready"),
        ("GET", "/v2/models/add_sub/versions/1"),
        ("GET", "/v2/models/add_sub/versions/1/ready"),
        ("POST", "/v2/models/add_sub/infer"),
        ("POST", "/v2/models/add_sub/versions/3/infer"),
    ],
)
def test_the_data_plane_is_forwarded(method: str, path: str) -> None:
    assert is_v2(path) and check(method, path, expose_statistics=False) is None


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v2/repository/index", 403),
        ("POST", "/v2/repository/models/m/load", 403),
        ("GET", "/v2/models/m/config", 403),
        ("POST", "/v2/models/m/generate", 403),
        ("GET", "/v2/logging", 403),
        ("GET", "/v2/models/stats", 403),
        ("GET", "/v2/models/m/versions/1/stats", 403),
        ("GET", "/v2/models/m/infer", 405),
        ("PUT", "/v2/health/ready", 405),
        ("POST", "/v2/models/m\u00e9/infer", 400),
        ("POST", "/v2/models/m n/infer", 400),
    ],
)
def test_everything_else_is_refused(method: str, path: str, status: int) -> None:
    refusal = check(method, path, expose_statistics=False)
    assert refusal is not None and refusal.status == status


def test_statistics_only_when_enabled() -> None:
    assert check("GET", "/v2/models/m/stats", expose_statistics=True) is None
    refusal = check("GET", "/v2/models/m/stats", expose_statistics=False)
    assert refusal is not None and "SPILLWAY_EXPOSE_STATISTICS=1" in refusal.message


def test_the_memo_of_decisions_stays_small_whatever_paths_clients_send() -> None:
    for i in range(3_000):
        surface.check("POST", f"/v2/models/m{i}/infer", False)
        surface.check("POST", f"/v2/models/{'x' * 1_000}{i}/infer", False)
    assert len(surface._decided) <= surface._CACHE_ENTRIES
    assert max(len(path) for _, path, _ in surface._decided) <= surface._CACHE_PATH_CHARS
    assert surface.check("POST", f"/v2/models/{'x' * 10_000}/infer", False) is None
