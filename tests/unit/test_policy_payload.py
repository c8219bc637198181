"""Payload-aware routing: no request goes to a target whose platform would refuse its body."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_plugin.config import (
    FC_MAX_HTTP_BYTES,
    FC_MAX_INVOKE_BYTES,
    LAMBDA_MAX_REQUEST_BYTES,
    SpillwayConfig,
    Target,
)
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.model import LOCAL, SHED
from gateway_plugin.policy.snapshot import LocalLoad, RequestFeatures, Snapshot, TargetState
from gateway_plugin.request.spillway import body_bytes

CONFIG = SpillwayConfig.model_validate(
    {
        "local": {"latency_target_ms": 100, "parallelism": 2},
        "targets": [
            {"name": "aws", "kind": "aws_lambda", "url": "https://a.example", "cold_start_ms": 500},
            {"name": "ali", "kind": "aliyun_fc", "url": "https://b.example", "cold_start_ms": 500},
            {"name": "big", "kind": "http", "url": "https://c.example", "max_request_bytes": 10**9},
        ],
    }
)
POLICY = build_policy(CONFIG)
BUSY = LocalLoad(fresh=True, queue_ms=3000, compute_ms=10, pending=600)
WARM = TargetState(warm_instances=3)
MB = 1024 * 1024


def features(size: int | None) -> RequestFeatures:
    return RequestFeatures("/v2/models/m/infer", {"x-data-classification": "public"}, {}, "m", size)


def test_platform_defaults_count_base64_growth_where_the_event_carries_the_body() -> None:
    def limit(**fields: object) -> int | None:
        return Target.model_validate({"name": "t", "url": "https://x", **fields}).request_limit_bytes

    assert limit(kind="aws_lambda") == LAMBDA_MAX_REQUEST_BYTES < 6 * MB * 3 // 4
    assert limit(kind="aliyun_fc") == FC_MAX_HTTP_BYTES == 32 * MB
    assert limit(kind="aliyun_fc", mode="invoke", function_name="f", service_name="s") == FC_MAX_INVOKE_BYTES
    assert limit(kind="http") is None
    assert limit(kind="aws_lambda", max_request_bytes=1000) == 1000


@pytest.mark.parametrize(
    ("size", "target"),
    [
        (1000, "aws"),
        (LAMBDA_MAX_REQUEST_BYTES, "aws"),
        (LAMBDA_MAX_REQUEST_BYTES + 1, "ali"),
        (FC_MAX_HTTP_BYTES + 1, "big"),
        (None, SHED),
    ],
    ids=["small", "at-lambda-limit", "past-lambda-next", "past-fc-last", "unknown-size-fits-nowhere"],
)
def test_a_body_too_big_for_a_target_goes_to_the_next_in_the_chain(size: int | None, target: str) -> None:
    """The cluster here is saturated: what no target takes is shed rather than queued."""
    snapshot = Snapshot({"m": BUSY}, {"aws": WARM, "ali": WARM, "big": WARM})
    assert decide(features(size), snapshot, POLICY).target == target


def test_a_body_no_target_takes_stays_local() -> None:
    only_lambda = build_policy(CONFIG.model_copy(update={"targets": CONFIG.targets[:1]}))
    decision = decide(features(8 * MB), Snapshot({"m": BUSY}, {"aws": WARM}), only_lambda)
    assert decision.target in (LOCAL, SHED) and decision.reason == "no_target"


@pytest.mark.parametrize(
    ("headers", "size"),
    [
        ({"content-length": "1234"}, 1234),
        ({}, 0),
        ({"transfer-encoding": "chunked"}, None),
        ({"content-length": "12x"}, None),
        ({"content-length": "-5"}, None),
        ({"content-length": "١٢"}, None),
    ],
)
def test_the_declared_size_is_read_from_content_length(headers: dict[str, str], size: int | None) -> None:
    assert body_bytes(headers) == size


@settings(max_examples=1000, deadline=None)
@given(
    st.one_of(st.none(), st.integers(0, 64 * MB)),
    st.dictionaries(st.sampled_from(["aws", "ali", "big"]), st.integers(1, 64 * MB), max_size=3),
    st.dictionaries(
        st.sampled_from(["aws", "ali", "big"]),
        st.builds(TargetState, in_flight=st.integers(0, 3), warm_instances=st.integers(0, 5)),
    ),
)
def test_no_request_is_ever_sent_to_a_target_that_refuses_its_size(
    size: int | None, limits: dict[str, int], states: dict[str, TargetState]
) -> None:
    targets = [t.model_copy(update={"max_request_bytes": limits.get(t.name)}) for t in CONFIG.targets]
    config = CONFIG.model_copy(update={"targets": targets})
    policy = build_policy(config)
    decision = decide(features(size), Snapshot({"m": BUSY}, states), policy)
    if decision.is_cloud:
        limit = config.targets[[t.name for t in config.targets].index(decision.target)].request_limit_bytes
        assert limit is None or (size is not None and size <= limit), (decision, size, limit)
