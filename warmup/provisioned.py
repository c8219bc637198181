"""Provisioned concurrency set to the wanted count, where a target says ``provisioned: true``.

Lambda (``PutProvisionedConcurrencyConfig`` on an alias or version) and FC (``PutProvisionConfig``
on a service alias) keep instances initialised at the platform's own expense, billed per second,
used or not. A round reads the current setting, changes it only when the wanted count differs
(so rounds are idempotent: an unchanged count costs one read, and no call that resets an
allocation), then reads it back: the allocated instances are what the round reports warm.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Protocol

import requests

from functions.contract import WarmupReport
from gateway_plugin.config import Target, WarmTarget
from gateway_plugin.targets.base import InvokeFailed
from warmup.pinger import TargetResult
from warmup.transports import describe

_MESSAGE_CHARS = 300
LAMBDA_PERMISSIONS = (
    "lambda:GetProvisionedConcurrencyConfig, lambda:PutProvisionedConcurrencyConfig and "
    "lambda:DeleteProvisionedConcurrencyConfig"
)
FC_PERMISSIONS = "fc:GetProvisionConfig and fc:PutProvisionConfig"
_CREDENTIALS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
    "ALIBABA_CLOUD_SECURITY_TOKEN",
)


class ProvisionFailed(Exception):
    """The platform refused or failed a provisioned-concurrency call; the message says what to do."""


@dataclass(frozen=True)
class Provisioned:
    """A function's provisioned concurrency as the platform reports it."""

    requested: int
    allocated: int
    status: str = ""
    reason: str = ""


class Provisioner(Protocol):
    def read(self) -> Provisioned: ...

    def set(self, instances: int) -> None: ...


def _refusal(call: str, status: object, code: str, message: str, permissions: str) -> str:
    """The platform's answer in words that say what to change; credentials withheld."""
    private = [v for v in (os.environ.get(n, "") for n in _CREDENTIALS) if v]
    said = message[:_MESSAGE_CHARS]
    if any(secret in said for secret in private):
        said = "(its message is not shown: it repeats the request's credentials)"
    text = f"{call} answered {status}" + (f" {code}" if code and code != str(status) else "")
    text += f": {said}" if said else ""
    if isinstance(status, int) and 300 <= status < 400:
        return f"{text}, a redirect, not followed; set the target's region or endpoint_url to the API's own"
    if status == 403 or "AccessDenied" in code:
        return f"{text}; grant the warm-up's credentials {permissions} on this function and qualifier"
    if status in (400, 404) or code in ("ResourceNotFoundException", "InvalidParameterValueException"):
        return (
            f"{text}; check that the function exists and that its qualifier names an alias or a "
            "published version"
        )
    return text


class LambdaProvisioner:
    """boto3's lambda client, signed as every Lambda call (SigV4)."""

    def __init__(self, target: Target, qualifier: str, client: Any = None) -> None:
        from gateway_plugin.targets.aws_lambda import lambda_client

        self.function = {"FunctionName": target.function_name or "", "Qualifier": qualifier}
        self._client = client or lambda_client(target)

    def read(self) -> Provisioned:
        got = self._call("GetProvisionedConcurrencyConfig", self._client.get_provisioned_concurrency_config)
        return Provisioned(
            got.get("RequestedProvisionedConcurrentExecutions", 0),
            got.get("AllocatedProvisionedConcurrentExecutions", 0),
            got.get("Status", ""),
            got.get("StatusReason", ""),
        )

    def set(self, instances: int) -> None:
        if instances:
            put = self._client.put_provisioned_concurrency_config
            self._call("PutProvisionedConcurrencyConfig", put, ProvisionedConcurrentExecutions=instances)
        else:
            self._call(
                "DeleteProvisionedConcurrencyConfig", self._client.delete_provisioned_concurrency_config
            )

    def _call(self, name: str, method: Any, **extra: int) -> dict[str, Any]:
        """The call's answer; none set yet reads as nothing requested."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer: dict[str, Any] = method(**self.function, **extra)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            if error.get("Code") == "ProvisionedConcurrencyConfigNotFoundException":
                return {}
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "an error")
            text = _refusal(
                f"Lambda {name}", status, error.get("Code", ""), error.get("Message", ""), LAMBDA_PERMISSIONS
            )
            raise ProvisionFailed(text) from None
        except BotoCoreError as exc:
            raise ProvisionFailed(f"Lambda {name}: {type(exc).__name__}") from None
        return answer


class FcProvisioner:
    """aliyun-fc2's client (redirects refused, nothing logged), signed ``FC id:signature``."""

    def __init__(self, target: Target, qualifier: str, client: Any = None) -> None:
        from gateway_plugin.targets.aliyun_fc import fc_client

        self.names = (target.service_name or "", qualifier, target.function_name or "")
        self._client = client or fc_client(target)

    def read(self) -> Provisioned:
        got = self._call("GetProvisionConfig", self._client.get_provision_config)
        return Provisioned(int(got.get("target") or 0), int(got.get("current") or 0))

    def set(self, instances: int) -> None:
        self._call("PutProvisionConfig", self._client.put_provision_config, instances)

    def _call(self, name: str, method: Any, *args: int) -> dict[str, Any]:
        from fc2.fc_exceptions import FcError

        try:
            answer = method(*self.names, *args)
        except FcError as exc:
            message, code = _fc_message(exc)
            raise ProvisionFailed(
                _refusal(f"FC {name}", exc.status_code, code, message, FC_PERMISSIONS)
            ) from None
        except Exception as exc:  # fc2 lets requests' errors through, and ours for a redirect
            raise ProvisionFailed(f"FC {name}: {_short(exc)}") from None
        data: dict[str, Any] = answer.data if isinstance(answer.data, dict) else {}
        return data


def _fc_message(exc: Any) -> tuple[str, str]:
    try:
        said = json.loads(exc.message)
    except (TypeError, ValueError):
        return str(exc.message), str(exc.err_code)
    return str(said.get("ErrorMessage") or said.get("message") or ""), str(
        exc.err_code or said.get("ErrorCode", "")
    )


def _short(exc: Exception) -> str:
    """An error without the URL and headers ``requests`` would repeat."""
    if isinstance(exc, requests.RequestException):
        return describe(exc)
    return str(exc) if isinstance(exc, InvokeFailed) else type(exc).__name__


def provisioner_for(target: Target, spec: WarmTarget) -> Provisioner:
    qualifier = spec.provisioned_qualifier(target) or ""
    if target.kind == "aws_lambda":
        return LambdaProvisioner(target, qualifier)
    return FcProvisioner(target, qualifier)


def placeholder_reports(allocated: int) -> dict[str, WarmupReport]:
    """The platform does not name provisioned instances: the round counts them under stable ids
    (``provisioned-1`` ...), and the report gives their number alone (``PROVISIONED_METRIC``), which
    the gateway counts as a floor of warm instances rather than as ids of its own."""
    return {
        f"provisioned-{i}": WarmupReport(
            instance_id=f"provisioned-{i}",
            cold=False,
            init_ms=0,
            uptime_s=0,
            triton_ready=True,
            models_ready=(),
        )
        for i in range(1, allocated + 1)
    }


def provision_target(name: str, provisioner: Provisioner, wanted: int) -> TargetResult:
    """Set, only if it differs, and read back: warm is what the platform has allocated."""
    result = TargetResult(name, wanted, provisioned=True)
    try:
        if provisioner.read().requested != wanted:
            provisioner.set(wanted)
        now = provisioner.read()
    except ProvisionFailed as exc:
        result.errors.append(f"{name}: {exc}")
        return result
    result.warm = placeholder_reports(min(now.allocated, wanted))
    if now.status == "FAILED":
        result.errors.append(f"{name}: provisioned concurrency FAILED: {now.reason or 'no reason given'}")
    elif now.allocated < wanted:
        result.errors.append(
            f"{name}: {now.allocated} of {wanted} allocated{f' ({now.status})' if now.status else ''}; "
            "provisioned concurrency takes minutes to allocate, so set it ahead of predicted bursts"
        )
    return result


def failed_provisioning(name: str, wanted: int, error: str) -> TargetResult:
    return TargetResult(name, wanted, errors=[f"{name}: {error}"], provisioned=True)
