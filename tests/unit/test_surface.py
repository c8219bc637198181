"""Which requests a function forwards to Triton: the allow-list, on normalised paths."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from functions import surface
from functions.contract import PathError, gateway_path, request_path
from functions.surface import check, is_v2


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/v2/models/m/infer", "/v2/models/m/infer"),
        ("//v2/repository", "/v2/repository"),
        ("/v2/./repository", "/v2/repository"),
        ("/v2/%72epository", "/v2/repository"),
        ("/v2/models/../repository", "/v2/repository"),
        ("/v2/models/%2e%2e/repository", "/v2/repository"),
        ("/../../v2/x/", "/v2/x"),
        ("/v2/models/a%2Fb/infer", "/v2/models/a/b/infer"),
        ("/v2/models/50%25off/infer", "/v2/models/50%off/infer"),
        ("", "/"),
    ],
)
def test_paths_are_decoded_once_and_resolved_as_nginx_reads_them(raw: str, normal: str) -> None:
    assert request_path(raw) == normal


@pytest.mark.parametrize(
    "raw",
    [
        "/v2/%2572epository",
        "/v2/models/secre%2574/infer",
        "/v2/models/%252e%252e/x",
        "/v2/models/a%252Fb/infer",
    ],
)
def test_a_path_encoded_more_than_once_is_refused(raw: str) -> None:
    """Decoding once more would read a path APISIX matched no route on: no layer may."""
    with pytest.raises(PathError, match="more than once"):
        request_path(raw)


@pytest.mark.parametrize(
    ("uri", "refused"),
    [
        ("/v2/models/m/infer", None),
        ("/v2/models/m/", None),
        ("/", None),
        ("/v2/models/secre%74/infer", "more than once"),
        ("/v2//models/m/infer", "normal form"),
        ("/v2/models/./m/infer", "normal form"),
        ("/v2/models/x/../secret/infer", "normal form"),
    ],
)
def test_the_gateway_decides_only_on_a_path_already_in_normal_form(uri: str, refused: str | None) -> None:
    if refused is None:
        assert gateway_path(uri) == uri.rstrip("/") or uri == "/"
    else:
        with pytest.raises(PathError, match=refused):
            gateway_path(uri)


@given(st.text(alphabet="/.%25%2e%2f%72v2repositorymodels", max_size=60))
def test_a_request_path_is_read_the_same_by_the_gateway_and_the_function(raw: str) -> None:
    """What the function serves (``request_path`` of the raw target) is what the gateway decided on
    (``gateway_path`` of nginx's ``$uri``, which is the same reading): stable, no dot segments."""
    try:
        normal = request_path(raw)
    except PathError:
        return
    assert gateway_path(normal) == normal
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
        ("POST", "/v2/models/llm/generate"),
        ("POST", "/v2/models/llm/generate_stream"),
        ("POST", "/v2/models/llm/versions/2/generate_stream"),
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
        ("GET", "/v2/models/m/generate_stream", 405),
        ("POST", "/v2/models/m/generate_streams", 403),
        ("POST", "/v2/models/m/generate/extra", 403),
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
    assert max(len(key[1]) for key in surface._decided) <= surface._CACHE_PATH_CHARS
    assert surface.check("POST", f"/v2/models/{'x' * 10_000}/infer", False) is None
