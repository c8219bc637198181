"""How a warm-up ping reaches a target: HTTPS to its URL (signed), Lambda Invoke or FC InvokeFunction."""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Protocol

import requests
from pydantic import ValidationError

from functions.contract import WARMUP_PATH, WarmupReport
from gateway_plugin.config import SpillwayConfig, Target
from gateway_plugin.config.secrets import signing_key
from gateway_plugin.targets.signing import TargetSigner
from gateway_plugin.targets.urls import masked_url, redirect_refused, url_secrets

_PREVIEW_CHARS = 200
# A warm-up report is a few hundred bytes; an answer past this is not one, and is not read on.
MAX_ANSWER_BYTES = 64 * 1024


class PingFailed(Exception):
    """One ping got no warm-up report (timeout, error status, wrong body, missing credentials)."""


class Transport(Protocol):
    def ping(self, payload: str, timeout_s: float) -> WarmupReport: ...


def _preview(raw: bytes | str, private: Collection[str] = ()) -> str:
    """The start of what a target answered, for the error; withheld when it repeats anything of the
    request that is not for printing (a server may echo the URL, the query or the headers)."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    if any(secret in text for secret in private):
        return "(its body is not shown: it repeats the request's credentials)"
    return repr(text[:_PREVIEW_CHARS].strip())


def parse_report(raw: bytes | str, where: str, private: Collection[str] = ()) -> WarmupReport:
    try:
        return WarmupReport.model_validate_json(raw)
    except ValidationError as exc:
        raise PingFailed(
            f"{where} answered with something other than a warm-up report: {_preview(raw, private)} "
            f"({exc.errors()[0]['msg']})"
        ) from None


def describe(exc: requests.RequestException, timeout_s: float | None = None) -> str:
    """What failed, in words of our own: ``requests``' messages repeat the URL, query and all."""
    within = f" within {timeout_s:g} s" if timeout_s is not None else " in time"
    if isinstance(exc, requests.ConnectTimeout):
        return f"timed out: no connection{within}"
    if isinstance(exc, requests.Timeout):
        return f"timed out: no answer{within}"
    cause = _os_error(exc)
    reason = f" ({cause.strerror})" if cause is not None else ""
    if isinstance(exc, requests.ConnectionError):
        return f"cannot connect{reason}"
    return f"{type(exc).__name__}{reason}"


def _os_error(exc: BaseException) -> OSError | None:
    """The system's own error under a library's wrappers (``Connection refused``, a DNS failure)."""
    seen: set[int] = set()
    current: object = exc
    while isinstance(current, BaseException) and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return current
        current = current.__cause__ or current.__context__ or getattr(current, "reason", None)
    return None


class HttpTransport:
    """POST {url}/spillway/warmup, signed like every gateway request, and to that origin only."""

    def __init__(self, target: Target, session: requests.Session) -> None:
        self.url = (target.url or "").rstrip("/") + WARMUP_PATH
        self.shown = masked_url(self.url)
        self.signer = TargetSigner(signing_key(target, os.environ), target.sign_body)
        self.session = session
        key = [self.signer.key.decode()] if self.signer.key else []
        self.private = frozenset([*url_secrets(target.url or ""), *key])

    def ping(self, payload: str, timeout_s: float) -> WarmupReport:
        body = payload.encode()
        headers = {"content-type": "application/json"}
        signature = self.signer.header("POST", WARMUP_PATH, body)
        if signature is not None:
            headers["x-spillway-signature"] = signature
        try:
            with self.session.post(
                self.url, data=body, headers=headers, timeout=timeout_s, allow_redirects=False, stream=True
            ) as answer:
                if 300 <= answer.status_code < 400:
                    raise PingFailed(
                        redirect_refused(answer.status_code, answer.headers.get("location"), self.url)
                        + "; set the target's url to the URL that answers without a redirect"
                    )
                content = self._content(answer)
        except requests.RequestException as exc:
            raise PingFailed(f"{self.shown}: {describe(exc, timeout_s)}") from None
        sent = answer.request.headers
        private = self.private | {sent.get(h, "") for h in ("authorization", "x-spillway-signature")} - {""}
        if answer.status_code != 200:
            raise PingFailed(f"{self.shown} answered {answer.status_code}: {_preview(content, private)}")
        return parse_report(content, self.shown, private)

    def _content(self, answer: requests.Response) -> bytes:
        """The answer's body, up to ``MAX_ANSWER_BYTES`` (decoded): past that the ping fails and
        the connection is closed with the rest unread."""
        content = bytearray()
        for piece in answer.iter_content(16 * 1024):
            content += piece
            if len(content) > MAX_ANSWER_BYTES:
                raise PingFailed(
                    f"{self.shown} answered {answer.status_code} with more than {MAX_ANSWER_BYTES} bytes, "
                    "where a warm-up report takes a few hundred; check that the target's url is the "
                    "function's"
                )
        return bytes(content)


class InvokeTransport:
    """The warm-up event straight to the function through the cloud's invoke API."""

    def __init__(self, target: Target) -> None:
        from gateway_plugin.targets.invoke import make_invoker

        self.name = target.name
        self.invoker = make_invoker(target)

    def ping(self, payload: str, timeout_s: float) -> WarmupReport:
        from gateway_plugin.targets.base import InvokeFailed

        try:
            raw = self.invoker.invoke(payload.encode())
        except InvokeFailed as exc:
            raise PingFailed(str(exc)) from None
        return parse_report(raw, self.name)


def check_signing_keys(config: SpillwayConfig) -> None:
    """Raises ``ConfigError`` for a pinged warm-up target whose key variable holds a blank key: a
    bad config, said once before any ping rather than by each round's workers (a provisioned target
    sends no ping, and needs no key)."""
    targets = {t.name: t for t in config.targets}
    for name, spec in config.warmup.targets.items():
        if targets[name].mode == "upstream" and not spec.provisioned:
            signing_key(targets[name], os.environ)


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
