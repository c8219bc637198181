"""``targets:``: the cloud functions that take overflow, their limits and their prices."""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway_plugin.config.model import Model
from gateway_plugin.request.header_names import FORWARDED_TO_CLOUD, HeaderName
from gateway_plugin.targets.urls import masked_url, not_an_origin

# Platform payload limits. Lambda takes 6 MB per synchronous invocation; Function URL and Invoke
# events carry a binary body base64-encoded (4 bytes per 3), inside an envelope of headers and
# context, for which 64 KiB is kept. FC's HTTP trigger passes 32 MB bodies as they are; its
# InvokeFunction event carries them base64-encoded like Lambda's.
_ENVELOPE_BYTES = 64 * 1024
LAMBDA_MAX_REQUEST_BYTES = (6 * 1024 * 1024 - _ENVELOPE_BYTES) * 3 // 4
FC_MAX_HTTP_BYTES = 32 * 1024 * 1024
FC_MAX_INVOKE_BYTES = (32 * 1024 * 1024 - _ENVELOPE_BYTES) * 3 // 4


class TargetCost(Model):
    """Per-request price model: requests, GB-seconds (Lambda) or compute units (FC), GPU-seconds,
    generated tokens. A stream of generated tokens is priced at decision as ``expected_duration_ms``
    and ``expected_output_tokens`` say, and settled when it ends at its real length and tokens."""

    usd_per_request: float = Field(
        default=0.0000002, ge=0, description="the platform's price per request, USD"
    )
    memory_gb: float = Field(
        default=4.0, gt=0, description="the function's memory in GB, billed per GB-second of its time"
    )
    usd_per_gb_second: float = Field(
        default=0.0000166667, ge=0, description="price of one GB-second of billed time, USD"
    )
    usd_per_gpu_second: float = Field(
        default=0.0, ge=0, description="price of one second of a GPU's billed time, USD (FC's GPU functions)"
    )
    expected_duration_ms: float = Field(default=100.0, gt=0, description="billed time of one inference")
    billed_init: bool = Field(default=True, description="a cold start's init time is billed (Lambda images)")
    usd_per_idle_second: float = Field(default=0.0, ge=0, description="a live idle instance (FC's idle GPUs)")
    usd_per_output_token: float = Field(
        default=0.0,
        ge=0,
        description="a price per generated token (the events of a streamed answer), on top of the rest",
    )
    expected_output_tokens: float = Field(
        default=0.0, ge=0, description="generated tokens of one answer, for its price at decision"
    )
    usd_per_input_token: float = Field(
        default=0.0,
        ge=0,
        description="a price per prompt token, on top of the rest; a stream's prompt is counted from its "
        "body when it ends (costs.BYTES_PER_INPUT_TOKEN bytes a token), any other request's at "
        "expected_input_tokens",
    )
    expected_input_tokens: float = Field(
        default=0.0, ge=0, description="prompt tokens of one request, for its price at decision"
    )
    usd_per_provisioned_gb_second: float = Field(
        default=0.0,
        ge=0,
        description="Lambda's provisioned-concurrency price per GB-second, billed used or not (0: unknown)",
    )


class Target(Model):
    """A cloud function that takes overflow."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$", description="the X-Spillway-Target value")
    kind: Literal["aws_lambda", "aliyun_fc", "http"] = Field(
        description="the platform: aws_lambda, aliyun_fc (Function Compute) or http (any HTTP endpoint)"
    )
    mode: Literal["upstream", "invoke"] = Field(
        default="upstream", description="upstream: APISIX proxies; invoke: the runner calls the cloud API"
    )
    url: str | None = Field(
        default=None,
        description="function URL / HTTP trigger (upstream mode): its origin, http(s)://host[:port]",
    )
    function_name: str | None = Field(default=None, description="function to invoke (invoke mode)")
    service_name: str | None = Field(default=None, description="FC service (invoke mode on aliyun_fc)")
    qualifier: str | None = Field(
        default=None, description="alias or version to invoke (invoke mode); unset: the unqualified function"
    )
    region: str | None = Field(
        default=None,
        description="the cloud region of the function (invoke mode's API, Lambda's request signing)",
    )
    endpoint_url: str | None = Field(default=None, description="API endpoint override (invoke mode)")
    concurrency_cap: int = Field(default=10, ge=1, description="in-flight requests the gateway allows")
    cold_start_ms: float = Field(default=5000.0, ge=0, description="expected start of a cold instance")
    timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="how long a request sent here may take, in s (the upstream's timeouts)",
    )
    signing_key_env: str | None = Field(
        default="SPILLWAY_SIGNING_KEY",
        description="environment variable holding the X-Spillway-Signature key",
    )
    sign_body: bool = Field(
        default=False,
        description="hash the body into the signature (fetches it from APISIX; else UNSIGNED-PAYLOAD)",
    )
    idle_ttl_s: float = Field(default=300.0, gt=0, description="how long an idle instance stays warm")
    instance_concurrency: int = Field(default=1, ge=1, le=1000, description="requests one instance serves")
    max_request_bytes: int | None = Field(
        default=None,
        ge=1,
        description="largest request body (Content-Length) sent here; default: the platform's limit",
    )
    forward_headers: list[HeaderName] = Field(
        default_factory=list,
        description="request headers sent on to this target besides what inference needs (none by default)",
    )
    cost: TargetCost = Field(default_factory=TargetCost, description="what a request sent here costs")

    @cached_property
    def forwarded(self) -> frozenset[str]:
        """Every request header this target may receive."""
        return FORWARDED_TO_CLOUD | frozenset(self.forward_headers)

    @property
    def request_limit_bytes(self) -> int | None:
        """The configured limit, else the platform's (None: no limit is known)."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        if self.kind == "aws_lambda":
            return LAMBDA_MAX_REQUEST_BYTES
        if self.kind == "aliyun_fc":
            return FC_MAX_INVOKE_BYTES if self.mode == "invoke" else FC_MAX_HTTP_BYTES
        return None

    @field_validator("url")
    @classmethod
    def _origin(cls, url: str | None) -> str | None:
        problem = None if url is None else not_an_origin(url)
        if url is not None and problem is not None:
            raise ValueError(
                f"{masked_url(url)} {problem}: a target's url is its function's origin, "
                "http(s)://host[:port] (a final / is fine), where APISIX sends each request with the "
                "client's own path and query and the warm-up posts /spillway/warmup; remove the rest"
            )
        return url

    @model_validator(mode="after")
    def _addressable(self) -> Target:
        if self.mode == "upstream" and not self.url:
            raise ValueError(f"target {self.name!r}: upstream mode needs url")
        if self.mode == "invoke" and self.kind == "http":
            raise ValueError(f"target {self.name!r}: kind http only works in upstream mode")
        if self.mode == "invoke" and not self.function_name:
            raise ValueError(f"target {self.name!r}: invoke mode needs function_name")
        if self.mode == "invoke" and self.kind == "aliyun_fc" and not self.service_name:
            raise ValueError(f"target {self.name!r}: invoke mode on aliyun_fc needs service_name")
        return self
