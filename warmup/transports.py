"""How a warm-up ping reaches a target: HTTPS to its URL (signed), Lambda Invoke or FC InvokeFunction."""

from __future__ import annotations

from typing import Protocol

import requests
from pydantic import ValidationError

from functions.contract import WARMUP_PATH, WarmupReport
from gateway_plugin.config import Target
from gateway_plugin.targets.signing import TargetSigner


class PingFailed(Exception):
    """One ping got no warm-up report (timeout, error status, wrong body, missing credentials)."""


class Transport(Protocol):
    def ping(self, payload: str, timeout_s: float) -> WarmupReport: ...


def parse_report(raw: bytes | str, where: str) -> WarmupReport:
    try:
        return WarmupReport.model_validate_json(raw)
    except ValidationError as exc:
        preview = (raw[:200] if isinstance(raw, str) else raw[:200].decode("utf-8", "replace")).strip()
        raise PingFailed(
            f"{where} answered with something other than a warm-up report: {preview!r} "
            f"({exc.errors()[0]['msg']})"
        ) from None


class HttpTransport:
    """POST {url}/spillway/warmup, signed like every gateway request."""

    def __init__(self, target: Target, session: requests.Session) -> None:
        self.url = (target.url or "").rstrip("/") + WARMUP_PATH
        self.signer = TargetSigner(target)
        self.session = session

    def ping(self, payload: str, timeout_s: float) -> WarmupReport:
        body = payload.encode()
        headers = {"content-type": "application/json"}
        signature = self.signer.header("POST", WARMUP_PATH, body)
        if signature is not None:
            headers["x-spillway-signature"] = signature
        try:
            answer = self.session.post(self.url, data=body, headers=headers, timeout=timeout_s)
        except requests.RequestException as exc:
            raise PingFailed(f"{self.url}: {exc}") from None
        if answer.status_code != 200:
            raise PingFailed(f"{self.url} answered {answer.status_code}: {answer.text[:200]}")
        return parse_report(answer.content, self.url)


class InvokeTransport:
    """The warm-up event straight to the function through the cloud's invoke API."""

    def __init__(self, target: Target) -> None:
        from gateway_plugin.targets.invoke import make_invoker

        self.name = target.name
        self.invoker = make_invoker(target)

    def ping(self, payload: str, timeout_s: float) -> WarmupReport:
        from gateway_plugin.targets.invoke import InvokeFailed

        try:
            raw = self.invoker.invoke(payload.encode())
        except InvokeFailed as exc:
            raise PingFailed(str(exc)) from None
        return parse_report(raw, self.name)


def transport_for(target: Target, pool_size: int) -> Transport:
    """Raises ``PingFailed`` when the target cannot be reached at all (no credentials, no URL)."""
    if target.mode == "invoke":
        try:
            return InvokeTransport(target)
        except ValueError as exc:
            raise PingFailed(f"cannot invoke {target.name}: {exc}; set the cloud's credentials") from None
    if not target.url:
        raise PingFailed(f"target {target.name} has no url to ping")
    return HttpTransport(target, pooled_session(pool_size))


def pooled_session(pool_size: int = 16) -> requests.Session:
    """Keep-alive connections enough for one wave of overlapping pings, and no retries: a retried
    ping would land on the instance it is meant to prove busy."""
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=pool_size, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
