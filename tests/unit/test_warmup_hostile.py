"""The warm-up against targets that redirect, fail or echo what they were sent: no redirect is
followed by any of its transports, and no secret of a target reaches the command's output."""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from functions.contract import WarmupReport
from functions.sidecar import free_port
from gateway_plugin.config import SpillwayConfig, Target
from gateway_plugin.targets.urls import masked_url, origin
from testing.http import QuietHandler, http_server_thread, wait_until
from testing.paths import ROOT
from testing.tls import make_ca, server_context
from warmup.rounds import plan, run_round
from warmup.transports import HttpTransport, PingFailed, pooled_session, transport_for

REDIRECTS = (301, 302, 303, 307, 308)
KEY_ENV = "SPILLWAY_TEST_WARMUP_KEY"
SIGNING_KEY = "signing-key-k3y-that-must-stay-private"
REPORT = WarmupReport(
    instance_id="i-1", cold=False, init_ms=1, uptime_s=1, triton_ready=True, models_ready=()
).model_dump_json()


@contextmanager
def recording() -> Iterator[tuple[str, list[str]]]:
    """A server that would answer any ping with a valid report, and notes every request it gets."""
    seen: list[str] = []

    class Handler(QuietHandler):
        def _any(self) -> None:
            seen.append(f"{self.command} {self.path} {dict(self.headers)}")
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self._send(200, REPORT.encode())

        do_GET = do_POST = do_PUT = _any

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with http_server_thread(Handler) as url:
        yield url, seen


@contextmanager
def failing(
    kind: str, location: str = "", status: int = 307, released: threading.Event | None = None
) -> Iterator[str]:
    """``redirect`` (``status``) to ``location``, ``echo`` the request back in a 500, ``deny`` it
    as FC's API does (403, JSON), or ``hang`` until released."""

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if kind == "hang" and released is not None:
                released.wait()
                return
            if kind == "redirect":
                self.send_response(status)
                self.send_header("location", location)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            if kind == "deny":
                denied = b'{"ErrorCode": "InvalidAccessKeyId", "ErrorMessage": "denied"}'
                self.send_response(403)
                self.send_header("content-length", str(len(denied)))
                self.end_headers()
                self.wfile.write(denied)
                return
            echoed = f"{self.requestline}\n{self.headers}\n".encode() + body
            self.send_response(500)
            self.send_header("content-length", str(len(echoed)))
            self.end_headers()
            self.wfile.write(echoed)

    with http_server_thread(Handler) as url:
        yield url


@pytest.mark.parametrize(
    ("url", "masked", "where"),
    [
        (
            "https://u:pw@fn.example/p?t=tok&bare#frag",
            "https://***@fn.example/p?t=***&***",
            "https://fn.example:443",
        ),
        ("http://t0ken@[::1]:8080/x?a=1", "http://***@[::1]:8080/x?a=***", "http://[::1]:8080"),
        ("http://[::1/x?a=1", "***", "***"),
    ],
)
def test_a_url_is_printed_without_its_user_part_query_values_or_fragment(
    url: str, masked: str, where: str
) -> None:
    assert (masked_url(url), origin(url)) == (masked, where)


@pytest.mark.parametrize("status", REDIRECTS)
def test_a_redirect_is_a_failed_ping_and_the_other_origin_gets_nothing(
    status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SIGNING_KEY)
    with recording() as (elsewhere, seen):
        port = elsewhere.rsplit(":", 1)[1]
        location = f"http://mallory:hunter2@127.0.0.1:{port}/steal?token=tok3n#frag"
        with failing("redirect", location, status) as url:
            target = Target(name="t", kind="http", url=url, signing_key_env=KEY_ENV)
            with pytest.raises(PingFailed) as failed:
                HttpTransport(target, pooled_session()).ping('{"dwell_ms": 0}', 10)
    assert seen == [], "the redirect's target received the signed ping"
    message = str(failed.value)
    assert f"answered {status}" in message and f"http://127.0.0.1:{port}" in message
    assert "url" in message, "the error says what to do"
    for private in ("mallory", "hunter2", "steal", "tok3n", "frag"):
        assert private not in message, message


@pytest.mark.parametrize("kind", ["aws_lambda", "aliyun_fc"])
@pytest.mark.parametrize("status", [302, 307, 308])
def test_the_cloud_invoke_transports_follow_no_redirect(
    kind: str, status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lambda Invoke through boto3 and FC InvokeFunction through aliyun-fc2, really signed."""
    token = "sts-t0ken-that-must-stay-private"
    for name, value in {
        "AWS_ACCESS_KEY_ID": "AKIDTEST",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "AWS_SESSION_TOKEN": token,
        "ALIBABA_CLOUD_ACCESS_KEY_ID": "LTAItest",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "fc-secret",
        "ALIBABA_CLOUD_SECURITY_TOKEN": token,
    }.items():
        monkeypatch.setenv(name, value)
    with recording() as (elsewhere, seen), failing("redirect", f"{elsewhere}/x", status) as url:
        target = Target(
            name="t",
            kind=kind,  # type: ignore[arg-type]
            mode="invoke",
            function_name="f",
            service_name="s",
            region="us-east-1",
            endpoint_url=url,
            timeout_s=10,
        )
        with pytest.raises(PingFailed) as failed:
            transport_for(target, 1).ping('{"dwell_ms": 0}', 10)
    assert seen == [], "the redirect's target received the invocation"
    assert token not in str(failed.value)


def _secrets_config(tmp: Path, urls: dict[str, str], metrics_url: str, fc_api: str) -> dict[str, Any]:
    targets = [{"name": n, "kind": "http", "url": url, "signing_key_env": KEY_ENV} for n, url in urls.items()]
    fc = {"kind": "aliyun_fc", "mode": "invoke", "service_name": "s", "function_name": "f"}
    targets.append({"name": "fc", **fc, "region": "cn-hangzhou", "endpoint_url": fc_api})
    spec: dict[str, Any] = {"instances": 1, "dwell_ms": 0}
    return {
        "targets": targets,
        "warmup": {
            "targets": {
                **{name: spec for name in [*urls, "fc"]},
                "refused": {**spec, "adaptive": {"metrics_url": metrics_url, "sample_s": 0.1}},
            },
            "waves": 1,
            "ping_timeout_s": 1,
            "report_file": str(tmp / "out" / "warm.prom"),
        },
    }


def test_no_secret_of_a_target_reaches_the_warmup_commands_output(tmp_path: Path) -> None:
    """The real command, its targets failing every way: refused, 500 echoing the request, no
    answer, a redirect; secrets in each URL's user and password (a target's url has no query), in
    the metrics URL's query, the redirect's Location and the signing key;
    FC's API refusing an invocation signed with a security token."""
    fc_credentials = {
        "ALIBABA_CLOUD_ACCESS_KEY_ID": "LTAItest",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "fc-s3cret",
        "ALIBABA_CLOUD_SECURITY_TOKEN": "sts-t0ken",
    }
    secrets = [SIGNING_KEY, "m0nitor-pw", "metr1cs-key", "fc-s3cret", "sts-t0ken"]

    def url_with_secrets(base: str, name: str) -> str:
        user, password = f"u5er-{name}", f"pa55-{name}"
        secrets.extend([user, password, base64.b64encode(f"{user}:{password}".encode()).decode()])
        return base.replace("http://", f"http://{user}:{password}@")

    released = threading.Event()
    with (
        recording() as (elsewhere, seen),
        failing("echo") as echo,
        failing("hang", released=released) as hang,
        failing("deny") as fc_api,
        failing("redirect", f"{elsewhere.replace('://', '://mallory:hunter2@')}/s?token=tok3n") as moved,
    ):
        secrets.extend(["hunter2", "tok3n"])
        refused = f"http://127.0.0.1:{free_port()}"
        urls = {
            name: url_with_secrets(base, name)
            for name, base in {"refused": refused, "echo": echo, "hang": hang, "moved": moved}.items()
        }
        metrics = f"http://monitor:m0nitor-pw@127.0.0.1:{free_port()}/metrics?key=metr1cs-key"
        config = tmp_path / "spillway.yaml"
        config.write_text(yaml.safe_dump(_secrets_config(tmp_path, urls, metrics, fc_api)))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ALIBABA", "AWS_"))}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "warmup", "run", "--once", "--json", "--config", str(config)],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env={**env, **fc_credentials, KEY_ENV: SIGNING_KEY},
                timeout=120,
            )
        finally:
            released.set()
    assert seen == []
    events = [json.loads(line) for line in done.stdout.splitlines()]
    errors = {e["target"]: e["errors"] for e in events if e["event"] == "target"}
    assert done.returncode == 1 and set(errors) == {"refused", "echo", "hang", "moved", "fc"}, done.stderr
    assert "answered 500" in errors["echo"][0] and "answered 307" in errors["moved"][0]
    assert "InvalidAccessKeyId" in errors["fc"][0]
    assert "cannot read the gateway's metrics" in done.stderr
    written = "".join(p.read_text() for p in (tmp_path / "out").rglob("*") if p.is_file())
    for secret in secrets:
        assert secret not in done.stdout + done.stderr + written, (secret, done.stdout, done.stderr)


def _warmup_command(config: dict[str, Any], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = tmp / "spillway.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "warmup", "run", "--once", "--json", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=120,
    )


@pytest.mark.parametrize("blank", [" ", "\t\n "])
def test_a_blank_signing_key_stops_the_warmup_naming_the_variable(tmp_path: Path, blank: str) -> None:
    with recording() as (url, seen):
        config = {
            "targets": [{"name": "t", "kind": "http", "url": url, "signing_key_env": KEY_ENV}],
            "warmup": {"targets": {"t": {"instances": 1, "dwell_ms": 0}}, "waves": 1},
        }
        done = _warmup_command(config, tmp_path, **{KEY_ENV: blank})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert KEY_ENV in done.stderr and "blank" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert seen == [], "an unsigned or blank-signed ping was sent"


def test_a_round_reports_a_target_with_a_blank_key_as_failed_and_warms_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, "  ")
    with recording() as (url, seen):
        config = SpillwayConfig.model_validate(
            {
                "targets": [
                    {"name": "blank", "kind": "http", "url": url, "signing_key_env": KEY_ENV},
                    {"name": "good", "kind": "http", "url": url, "signing_key_env": None},
                ],
                "warmup": {"targets": {n: {"instances": 1, "dwell_ms": 0} for n in ("blank", "good")}},
            }
        )
        rows = plan(config, datetime.datetime.now(datetime.UTC), {})
        blank, good = run_round(config, rows)
    assert not blank.ok and KEY_ENV in blank.errors[0] and "blank" in blank.errors[0]
    assert good.ok and len(seen) == 1


HUGE = 256 * 1024 * 1024


@contextmanager
def streaming(status: int) -> Iterator[tuple[str, list[int]]]:
    """A target that answers ``status`` with 256 MiB, as fast as the client reads; notes how much
    it managed to send."""
    sent: list[int] = []

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(status)
            self.send_header("content-length", str(HUGE))
            self.end_headers()
            piece, total = b"x" * (1 << 20), 0
            try:
                while total < HUGE:
                    self.wfile.write(piece)
                    total += len(piece)
            except OSError:
                pass
            sent.append(total)

    with http_server_thread(Handler) as url:
        yield url, sent


@pytest.mark.parametrize("status", [200, 500])
def test_a_huge_answer_fails_the_ping_past_64_kib_and_is_not_read(status: int) -> None:
    with streaming(status) as (url, sent):
        target = Target(name="t", kind="http", url=url, signing_key_env=None)
        with pytest.raises(PingFailed) as failed:
            HttpTransport(target, pooled_session()).ping('{"dwell_ms": 0}', 30)
        wait_until(lambda: bool(sent), 30, "the target's answer ended")
    assert "65536 bytes" in str(failed.value), failed.value
    assert sent[0] < HUGE // 4, f"the pinger read {sent[0]} bytes of the answer"


@pytest.mark.parametrize(
    "url",
    [
        "https://deploy:pa55word@127.0.0.1:9/base",
        "https://127.0.0.1:9/?token=t0ken",
        "https://127.0.0.1:9/base?token=t0ken&x=1",
        "https://127.0.0.1:9#t0ken",
        "ftp://127.0.0.1:9",
    ],
)
@pytest.mark.parametrize("command", ["check-config", "warmup"])
def test_a_target_url_with_a_path_or_query_is_refused_saying_what_is_allowed(
    tmp_path: Path, url: str, command: str
) -> None:
    """APISIX sends each request to a target's origin with the client's own path and query, so a
    path or query there would apply to the signed warm-up ping alone, and break its signature."""
    path = tmp_path / "spillway.yaml"
    config = {
        "targets": [{"name": "t", "kind": "http", "url": url}],
        "warmup": {"targets": {"t": {"instances": 1}}},
    }
    path.write_text(yaml.safe_dump(config))
    args = (
        ["gateway_plugin", "check-config"]
        if command == "check-config"
        else ["warmup", "run", "--once", "--config"]
    )
    done = subprocess.run(
        [sys.executable, "-m", *args, str(path)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "targets.0.url" in done.stderr and "http(s)://host[:port]" in done.stderr, done.stderr
    for secret in ("deploy", "pa55word", "t0ken"):
        assert secret not in done.stdout + done.stderr, done.stderr


@pytest.mark.parametrize(
    "url", ["https://fn.example", "https://abc.lambda-url.us-east-1.on.aws/", "http://[::1]:9000"]
)
def test_a_target_url_naming_an_origin_is_taken(url: str) -> None:
    target = Target(name="t", kind="http", url=url, signing_key_env=None)
    assert HttpTransport(target, pooled_session()).url == url.rstrip("/") + "/spillway/warmup"


def test_a_target_whose_certificate_does_not_verify_gets_no_ping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up's HTTPS is verified (the system's CAs, or REQUESTS_CA_BUNDLE's): a function URL
    answering with a certificate from a CA nobody trusts never sees the signed ping."""
    from testing.standins import upstream

    monkeypatch.setenv(KEY_ENV, SIGNING_KEY)
    stranger = make_ca(tmp_path, "stranger-ca")
    with upstream("fn", tls=server_context(tmp_path, "fn", "localhost", stranger), host="localhost") as fn:
        target = Target(name="t", kind="http", url=fn.url, signing_key_env=KEY_ENV)
        with pytest.raises(PingFailed, match=r"certificate|SSL"):
            HttpTransport(target, pooled_session()).ping('{"dwell_ms": 0}', 10)
        assert fn.seen == []
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(stranger.cert))
        with pytest.raises(PingFailed, match="warm-up report"):  # trusted now: it answers, not a report
            HttpTransport(target, pooled_session()).ping('{"dwell_ms": 0}', 10)
        assert len(fn.seen) == 1
