"""Alibaba Cloud FC ``InvokeFunction`` with aliyun-fc2 (requests signed ``Authorization: FC ...``)."""

from __future__ import annotations

import os
from typing import Any

import fc2

from gateway_plugin.config import Target
from gateway_plugin.targets.invoke import InvokeFailed


class FcInvoker:
    def __init__(self, target: Target, client: Any = None) -> None:
        self.service = target.service_name or ""
        self.function_name = target.function_name or ""
        self.qualifier = target.qualifier
        self._client = client or fc2.Client(
            endpoint=target.endpoint_url
            or f"https://{os.environ.get('ALIBABA_CLOUD_ACCOUNT_ID', '')}.{target.region}.fc.aliyuncs.com",
            accessKeyID=os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID", ""),
            accessKeySecret=os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET", ""),
            securityToken=os.environ.get("ALIBABA_CLOUD_SECURITY_TOKEN", ""),
            Timeout=target.timeout_s,
        )

    def invoke(self, payload: bytes) -> bytes:
        try:
            response = self._client.invoke_function(
                self.service,
                self.function_name,
                payload=payload,
                headers={"x-fc-invocation-type": "Sync"},
                qualifier=self.qualifier,
            )
        except Exception as exc:  # fc2 raises FcError and requests' errors alike
            raise InvokeFailed(f"FC InvokeFunction of {self.service}/{self.function_name}: {exc}") from exc
        data = response.data
        return data if isinstance(data, bytes) else str(data).encode()
