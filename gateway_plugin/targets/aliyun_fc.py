"""Alibaba Cloud FC ``InvokeFunction`` with aliyun-fc2 (requests signed ``Authorization: FC ...``)."""

from __future__ import annotations

import os
from typing import Any

import fc2
import fc2.client
import requests

from gateway_plugin.config import Target
from gateway_plugin.targets.base import InvokeFailed
from gateway_plugin.targets.urls import redirect_refused


class _Client(fc2.Client):  # type: ignore[misc]  # fc2 has no type hints
    """fc2's client, sending as fc2 does (its connection retries included) but following no redirect
    and logging nothing: fc2 lets ``requests`` follow a redirect, which re-sends the invocation's
    body and its ``x-fc-*`` headers, the security token among them, to wherever ``Location`` points;
    and it logs a failed request's headers, the token with them."""

    def _do_request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        params: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> requests.Response:
        url = f"{self.endpoint}{path}"
        answer: requests.Response = fc2.client.requestWithTry(
            method,
            url,
            headers=headers,
            params=params,
            data=body,
            timeout=self.timeout,
            allow_redirects=False,
        )
        if 300 <= answer.status_code < 400:
            raise InvokeFailed(
                redirect_refused(answer.status_code, answer.headers.get("location"), url)
                + "; set the target's region or endpoint_url to FC's own endpoint"
            )
        if answer.status_code >= 400:
            raise self._Client__gen_request_err(answer)
        return answer


def fc_client(target: Target) -> Any:
    """aliyun-fc2's client for ``target`` (redirects refused, nothing logged), with the credentials
    in the environment."""
    return _Client(
        endpoint=target.endpoint_url
        or f"https://{os.environ.get('ALIBABA_CLOUD_ACCOUNT_ID', '')}.{target.region}.fc.aliyuncs.com",
        accessKeyID=os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID", ""),
        accessKeySecret=os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET", ""),
        securityToken=os.environ.get("ALIBABA_CLOUD_SECURITY_TOKEN", ""),
        Timeout=target.timeout_s,
    )


class FcInvoker:
    def __init__(self, target: Target, client: Any = None) -> None:
        self.service = target.service_name or ""
        self.function_name = target.function_name or ""
        self.qualifier = target.qualifier
        self._client = client or fc_client(target)

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
