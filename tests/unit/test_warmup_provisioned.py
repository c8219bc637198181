"""Provisioned concurrency in place of pings: set through the real SDKs (boto3's lambda client,
aliyun-fc2), really signed, checked by loopback stand-ins of the two APIs, read back and reported
as the pinged targets are; refused calls fail their target alone, saying what to do."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from gateway_plugin.books.warm_instances import read_warm_counts, read_warm_report
from gateway_plugin.config import ConfigError, SpillwayConfig, parse
from testing.cloud_apis import AWS_KEY, AWS_SECRET, FC_KEY, FC_SECRET, REGION, provisioning_fake
from testing.gateway import gateway_state
from testing.http import QuietHandler, http_server_thread
from warmup.cli import _plan_text
from warmup.pinger import TargetResult
from warmup.provisioned import placeholder_reports
from warmup.report import prometheus_text, summary
from warmup.rounds import plan, run_round
from warmup.transports import check_signing_keys

TOKEN = "sts-t0ken-that-must-stay-private"
NOW = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
LAMBDA_PATH = "/2019-09-30/functions/infer/provisioned-concurrency?Qualifier=live"
FUNCTION_URL = "https://x.lambda-url.us-east-1.on.aws"
FC_PATH = "/2016-08-15/services/svc.live/functions/infer/provision-config"


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": AWS_KEY,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "AWS_SESSION_TOKEN": TOKEN,
        "ALIBABA_CLOUD_ACCESS_KEY_ID": FC_KEY,
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": FC_SECRET,
        "ALIBABA_CLOUD_SECURITY_TOKEN": TOKEN,
    }.items():
        monkeypatch.setenv(name, value)


def lambda_target(endpoint: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "aws",
        "kind": "aws_lambda",
        "mode": "invoke",
        "function_name": "infer",
        "qualifier": "live",
        "region": REGION,
        "endpoint_url": endpoint,
        **extra,
    }


def fc_target(endpoint: str) -> dict[str, Any]:
    return {
        "name": "fc",
        "kind": "aliyun_fc",
        "mode": "invoke",
        "service_name": "svc",
        "function_name": "infer",
        "qualifier": "live",
        "region": "cn-hangzhou",
        "endpoint_url": endpoint,
    }


def config(targets: list[dict[str, Any]], **warm: dict[str, Any]) -> SpillwayConfig:
    return SpillwayConfig.model_validate({"targets": targets, "warmup": {"targets": warm}})


def one_round(cfg: SpillwayConfig) -> list[Any]:
    return run_round(cfg, plan(cfg, NOW, {}))


def test_lambda_provisioned_concurrency_is_put_signed_read_back_and_reported() -> None:
    with provisioning_fake() as fake:
        cfg = config([lambda_target(fake.url)], aws={"instances": 2, "provisioned": True})
        (result,) = one_round(cfg)
    assert fake.invalid == [], "a call was not signed as SigV4 requires"
    assert fake.sent("PUT") == [(LAMBDA_PATH, b'{"ProvisionedConcurrentExecutions": 2}')]
    assert [m for m, _, _ in fake.calls] == ["GET", "PUT", "GET"]
    assert result.ok and len(result.warm) == 2 and result.pings == 0
    assert summary(result)["warm"] == 2 and summary(result)["provisioned"] is True
    text = prometheus_text([result]).decode()
    assert 'spillway_warmup_warm_instances{target="aws"} 2.0' in text


def test_fc_provision_config_is_put_signed_read_back_and_reported() -> None:
    with provisioning_fake() as fake:
        cfg = config([fc_target(fake.url)], fc={"instances": 3, "provisioned": True})
        (result,) = one_round(cfg)
    assert fake.invalid == [], "a call was not signed as FC requires"
    assert fake.sent("PUT") == [(FC_PATH, b'{"target": 3}')]
    assert [m for m, _, _ in fake.calls] == ["GET", "PUT", "GET"]
    assert result.ok and len(result.warm) == 3


def test_a_round_calls_the_api_only_when_the_wanted_number_changes() -> None:
    with provisioning_fake() as fake:
        cfg = config(
            [lambda_target(fake.url), fc_target(fake.url)],
            **{n: {"instances": 2, "provisioned": True} for n in ("aws", "fc")},
        )
        one_round(cfg)
        fake.calls.clear()
        again = one_round(cfg)
        assert fake.sent("PUT") == [] and all(r.ok for r in again)
        windows = [{"start": "00:00", "end": "24:00", "instances": 0}]
        stopped = config(
            [lambda_target(fake.url), fc_target(fake.url)],
            **{n: {"instances": 2, "windows": windows, "provisioned": True} for n in ("aws", "fc")},
        )
        fake.calls.clear()
        one_round(stopped)
    assert fake.sent("DELETE") == [(LAMBDA_PATH, b"")]
    assert fake.sent("PUT") == [(FC_PATH, b'{"target": 0}')]
    assert fake.requested == {FC_PATH: 0}


def test_an_allocation_in_progress_is_short_and_says_it_takes_minutes() -> None:
    with provisioning_fake() as fake:
        fake.allocate = False
        (result,) = one_round(config([lambda_target(fake.url)], aws={"instances": 2, "provisioned": True}))
    assert not result.ok and len(result.warm) == 0
    assert "0 of 2 allocated" in result.errors[0] and "minutes" in result.errors[0]


@pytest.mark.parametrize("kind", ["aws", "fc"])
def test_a_refused_call_fails_that_target_saying_which_permission_and_the_others_go_on(kind: str) -> None:
    with provisioning_fake() as fake, provisioning_fake() as good:
        fake.refuse = True
        refused = lambda_target(fake.url) if kind == "aws" else fc_target(fake.url)
        other = {**lambda_target(good.url), "name": "other"}
        cfg = config([refused, other], **{n: {"instances": 1, "provisioned": True} for n in (kind, "other")})
        bad, ok = one_round(cfg)
    assert fake.invalid == []
    assert not bad.ok and ok.ok
    error = bad.errors[0]
    permission = "lambda:GetProvisionedConcurrencyConfig" if kind == "aws" else "fc:GetProvisionConfig"
    assert kind in error and permission in error and "403" in error, error
    for secret in (TOKEN, AWS_SECRET, FC_SECRET):
        assert secret not in json.dumps(summary(bad))


@contextmanager
def redirecting() -> Iterator[tuple[str, list[str]]]:
    """An endpoint that sends every call elsewhere, and the elsewhere, noting what reached it."""
    seen: list[str] = []

    class Elsewhere(QuietHandler):
        def _any(self) -> None:
            seen.append(f"{self.command} {self.path} {dict(self.headers)}")
            self.reply(b"{}")

        do_GET = do_PUT = do_DELETE = _any

    with http_server_thread(Elsewhere) as elsewhere:

        class Moved(QuietHandler):
            def _any(self) -> None:
                self.send_response(307)
                self.send_header("Location", f"{elsewhere}{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_PUT = do_DELETE = _any

        with http_server_thread(Moved) as url:
            yield url, seen


@pytest.mark.parametrize("kind", ["aws", "fc"])
def test_a_redirect_sends_no_provisioning_call_and_no_credentials_elsewhere(kind: str) -> None:
    with redirecting() as (url, seen):
        target = lambda_target(url) if kind == "aws" else fc_target(url)
        (result,) = one_round(config([target], **{kind: {"instances": 1, "provisioned": True}}))
    assert seen == [], "the redirect's target received a provisioning call"
    assert not result.ok and kind in result.errors[0] and TOKEN not in result.errors[0]


def bad(targets: list[dict[str, Any]], spec: dict[str, Any]) -> str:
    name = targets[0]["name"]
    with pytest.raises(ConfigError) as refused:
        parse({"targets": targets, "warmup": {"targets": {name: {"provisioned": True, **spec}}}})
    return str(refused.value)


@pytest.mark.parametrize(
    ("target", "spec", "said"),
    [
        ({"qualifier": None}, {}, "needs a qualifier"),
        ({"qualifier": "$LATEST"}, {}, "$LATEST"),
        ({}, {"qualifier": "$LATEST"}, "$LATEST"),
        ({}, {"qualifier": "blue"}, "invokes qualifier 'live'"),
        ({"mode": "upstream", "url": FUNCTION_URL, "function_name": None}, {}, "function_name"),
    ],
)
def test_a_provisioned_lambda_target_without_a_usable_qualifier_is_refused(
    target: dict[str, Any], spec: dict[str, Any], said: str
) -> None:
    message = bad([lambda_target("http://127.0.0.1:1", **target)], spec)
    assert "warmup.targets.aws" in message and said in message, message


def test_a_provisioned_fc_target_on_latest_and_a_plain_http_target_are_refused() -> None:
    assert "LATEST" in bad([{**fc_target("http://127.0.0.1:1"), "qualifier": "LATEST"}], {})
    message = bad([{"name": "web", "kind": "http", "url": "https://example.com"}], {})
    assert "warmup.targets.web" in message and "aws_lambda or aliyun_fc" in message, message


def test_an_upstream_target_may_name_its_qualifier_in_the_warmup_section() -> None:
    upstream = {"mode": "upstream", "url": FUNCTION_URL, "qualifier": None}
    spec = {"provisioned": True, "qualifier": "live"}
    cfg = config([lambda_target("http://127.0.0.1:1", **upstream)], aws=spec)
    assert cfg.warmup.targets["aws"].qualifier == "live"


def test_plan_prices_provisioned_instances_next_to_the_pings() -> None:
    price = {"memory_gb": 4.0, "usd_per_provisioned_gb_second": 0.0000041667}
    fc_cost = {"usd_per_idle_second": 0.0001}
    cfg = config(
        [
            lambda_target("http://127.0.0.1:1", cost=price),
            {**fc_target("http://127.0.0.1:1"), "cost": fc_cost},
            {**lambda_target("http://127.0.0.1:1"), "name": "unpriced"},
        ],
        aws={"instances": 2, "provisioned": True},
        fc={"instances": 2},
        unpriced={"instances": 2},
    )
    rows = {r.target: r for r in plan(cfg, NOW, {})}
    month_s = 30 * 24 * 3600
    assert rows["aws"].provisioned_monthly_usd == pytest.approx(2 * 4.0 * 0.0000041667 * month_s, abs=1e-4)
    assert rows["fc"].provisioned_monthly_usd == pytest.approx(2 * 0.0001 * month_s, abs=1e-4)
    assert rows["unpriced"].provisioned_monthly_usd is None
    assert rows["aws"].monthly_usd > 0 and rows["aws"].how.startswith("provisioned")


def test_a_provisioned_upstream_target_needs_no_signing_key_and_plan_says_which_way_is_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It sends no ping, so a blank key variable (which stops a pinged target's warm-up) is no
    reason to refuse it."""
    monkeypatch.setenv("SPILLWAY_TEST_PROVISIONED_KEY", " ")
    upstream = {"mode": "upstream", "url": FUNCTION_URL, "signing_key_env": "SPILLWAY_TEST_PROVISIONED_KEY"}
    cfg = config([lambda_target("http://127.0.0.1:1", **upstream)], aws={"provisioned": True})
    check_signing_keys(cfg)
    (row,) = plan(cfg, NOW, {})
    assert _plan_text(row).endswith(
        f"pings about ${row.monthly_usd}/month, provisioned concurrency not priced (in use)"
    )


def test_the_gateway_counts_provisioned_instances_once_whichever_ids_their_answers_bring() -> None:
    """The platform names no provisioned instance: the report gives their number, not ids, and the
    gateway's pool counts at least that many warm. Answers from two real instances of a target with
    two provisioned are two warm, not four; a round that provisions none takes the floor away."""
    config = SpillwayConfig.model_validate(
        {
            "targets": [{"name": "fn", "kind": "http", "url": "https://fn.example", "signing_key_env": None}],
            "metrics": {"listen": None},
        }
    )
    state = gateway_state(config)
    provisioned = TargetResult("fn", 2, provisioned=True)
    provisioned.warm = placeholder_reports(2)
    text = prometheus_text([provisioned]).decode()
    assert read_warm_report(text) == {}
    state.warm_counts(*read_warm_counts(text))
    for target, instances in read_warm_report(text).items():
        state.warm_report(target, instances)
    now = state.clock()
    assert state.pools["fn"].warm(now) == 2
    for instance in ("real-a", "real-b"):
        state.pools["fn"].seen(instance, now)
    assert state.pools["fn"].warm(now) == 2
    state.pools["fn"].seen("real-c", now)
    assert state.pools["fn"].warm(now) == 3
    state.warm_counts(*read_warm_counts(prometheus_text([TargetResult("fn", 0)]).decode()))
    assert state.pools["fn"].provisioned == 0
