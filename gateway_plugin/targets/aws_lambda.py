"""AWS Lambda ``Invoke`` with boto3: SigV4-signed, pooled, no SDK retries (the gateway decides)."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

from gateway_plugin.config import Target
from gateway_plugin.targets.base import InvokeFailed


def lambda_client(target: Target) -> Any:
    """boto3's lambda client for ``target``, on a session of its own: boto3's default one keeps the
    first credentials it resolved, so a reload with new credentials in the environment would go on
    signing with the old ones. No SDK retries: the caller decides (the gateway, the next warm-up)."""
    return boto3.session.Session().client(
        "lambda",
        region_name=target.region,
        endpoint_url=target.endpoint_url,
        config=Config(
            max_pool_connections=target.concurrency_cap,
            connect_timeout=2,
            read_timeout=target.timeout_s,
            retries={"max_attempts": 0, "mode": "standard"},
        ),
    )


class LambdaInvoker:
    def __init__(self, target: Target, client: Any = None) -> None:
        self.function_name = target.function_name or ""
        self.qualifier = target.qualifier
        self._client = client or lambda_client(target)

    def invoke(self, payload: bytes) -> bytes:
        kwargs: dict[str, Any] = {"FunctionName": self.function_name, "Payload": payload}
        if self.qualifier:
            kwargs["Qualifier"] = self.qualifier
        try:
            response = self._client.invoke(**kwargs)
        except Exception as exc:  # botocore raises many types; the caller only needs "failed"
            raise InvokeFailed(f"Lambda Invoke of {self.function_name}: {exc}") from exc
        data: bytes = response["Payload"].read()
        if response.get("FunctionError"):
            raise InvokeFailed(f"Lambda function error ({response['FunctionError']}): {data[:500]!r}")
        return data
