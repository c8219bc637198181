"""A Secrets Manager stand-in on loopback: moto's server, which boto3 reaches through
``AWS_ENDPOINT_URL_SECRETS_MANAGER`` as it would reach AWS. Moto does not check signatures, so
what it proves is the function's side: that it finds boto3, reads the secret named by its ARN at
init, and uses that value as its key."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from functions.sidecar import free_port
from testing.http import http, wait_until

REGION = "us-east-1"
# What Lambda puts in every function's environment; moto takes any credentials.
LAMBDA_CREDENTIALS = {
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
    "AWS_ACCESS_KEY_ID": "ASIATESTFUNCTIONROLE",
    "AWS_SECRET_ACCESS_KEY": "function-role-secret-for-the-stand-in",
    "AWS_SESSION_TOKEN": "function-role-session-token",
}


@dataclass(frozen=True)
class Secret:
    endpoint: str
    arn: str
    value: str

    def function_env(self) -> dict[str, str]:
        """What the function needs to read this secret as it would on Lambda."""
        return {**LAMBDA_CREDENTIALS, "AWS_ENDPOINT_URL_SECRETS_MANAGER": self.endpoint}


def _answers(url: str) -> bool:
    try:
        return http("GET", url, timeout=1)[0] < 500
    except OSError:
        return False


@contextmanager
def secrets_manager(tmp: Path, name: str, value: str) -> Iterator[Secret]:
    """moto_server on a free loopback port, holding one secret."""
    import boto3

    port = free_port()
    log = tmp / f"moto-{port}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(endpoint + "/moto-api/") or proc.poll() is not None, 30, "moto_server up")
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited:\n{log.read_text(errors='replace')}")
        client = boto3.client(
            "secretsmanager",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )
        arn = client.create_secret(Name=name, SecretString=value)["ARN"]
        yield Secret(endpoint, arn, value)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
