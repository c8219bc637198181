"""``spillway``: the routing plugin. Turns each APISIX call into a decision and acts on it.

Request filter: one reading of the request (``request_reading``; 400 when none is possible) →
features → snapshot from the live state → ``policy.decide`` (where the route or rule asks and the
decision is a cloud one, the request's text is read first and a match decides it as a class that
may not leave: ``content.checks``; a body it cannot read as Triton would, with a key twice in an
object, is refused with 400) → ``X-Spillway-Target`` (and a
signature, and only the headers the target may receive) for the route's edge to hand to APISIX's
traffic-split, a Stop carrying the function's answer in invoke mode, or a Stop with 429/503 and
Retry-After when shedding. No spelling of the client's own ``X-Spillway-*`` survives.
What happened afterwards comes back from the route's http-logger (``books.outcomes``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from functions.contract import (
    HEADER_DECISION,
    HEADER_SIGNATURE,
    HEADER_TARGET,
    PathError,
    gateway_path,
    http_api_event,
    model_of,
)
from functions.signature import canonical_target
from gateway_plugin.books.ledger import streamed
from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.content.checks import (
    HEADER_JSON_LENGTH,
    ContentPolicy,
    RouteChecks,
    Verdict,
    body_verdict,
    route_checks,
    size_verdict,
    tightened,
)
from gateway_plugin.plugin import HttpRequest, Plugin, RequestAction
from gateway_plugin.policy.admission import invalid_message
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.model import LOCAL, SHED, Decision, Policy, Reason
from gateway_plugin.policy.snapshot import RequestFeatures
from gateway_plugin.request.audit import HEADER_AUDIT, audit_header, refused_header
from gateway_plugin.request.header_names import HEADER_CONSUMER, HEADER_TENANT, HEADER_WORKER
from gateway_plugin.request.reading import as_decided, forget, forward_only, read_headers, settle
from gateway_plugin.targets.base import InvokeFailed, Invoker
from gateway_plugin.targets.invoke import InvokePool

log = logging.getLogger("spillway.plugin")

_NO_CONSUMER = (
    "no authenticated consumer: tenants.source is consumer, so the tenant comes from APISIX's "
    "authentication; put an authentication plugin before Spillway on this route (apisix-route --auth)"
)
_NO_ARGS: dict[str, str] = {}


class RouteOverrides(BaseModel):
    """A route's ``{"name": "spillway", "value": ...}``: narrows or tunes the global policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_target_ms: float | None = Field(default=None, gt=0)
    targets: list[str] | None = Field(default=None, description="this route's overflow chain")
    rules: list[str] | None = Field(default=None, description="names of the global rules that apply here")
    on_prem_only: bool = Field(default=False, description="nothing on this route may leave the premises")
    content_checks: bool = Field(
        default=False,
        description="read the text inputs of a request that would leave: one the content: detectors "
        "match stays on premises",
    )
    decision_header: bool | None = Field(
        default=None,
        description="X-Spillway-Decision on this route's answers (None: as metrics.decision_header)",
    )


def _route_policy(base: Policy, route: RouteOverrides) -> Policy:
    changes: dict[str, Any] = {}
    if route.latency_target_ms is not None:
        changes["latency_target_ms"] = route.latency_target_ms
    if route.targets is not None:
        changes["default_chain"] = tuple(t for t in route.targets if t in base.targets)
    if route.rules is not None:
        changes["rules"] = tuple(r for r in base.rules if r.name in route.rules)
    if route.on_prem_only:
        changes["cloud_allowed"] = frozenset()
        changes["unclassified_may_leave"] = False
    return dataclasses.replace(base, **changes) if changes else base


class PreparedRoute:
    """A route's overrides, prepared once per conf token, with the policy they give under the
    current global config, the headers that policy reads and the content checks the route has
    (rebuilt only when a reload changed them)."""

    __slots__ = ("checks", "overrides", "policy", "read", "version")

    def __init__(self, overrides: RouteOverrides) -> None:
        self.overrides = overrides
        self.version = -1
        self.policy: Policy | None = None
        self.read: frozenset[str] = frozenset()
        self.checks: RouteChecks | None = None


class SpillwayPlugin(Plugin[PreparedRoute]):
    name = "spillway"
    config_model = RouteOverrides

    def __init__(
        self, state: GatewayState, invokers: dict[str, Invoker] | None = None, pool: InvokePool | None = None
    ) -> None:
        self.state = state
        self._invokers = invokers or {}
        self._pool = pool

    def reload(self, config: SpillwayConfig, secrets: GatewaySecrets, invokers: dict[str, Invoker]) -> None:
        """A new config and the secrets and invokers read for it, taken together."""
        self.state.apply(config, secrets)
        self._invokers = invokers

    def prepare(self, config: Any) -> PreparedRoute:
        return PreparedRoute(config)

    def policy_for(self, route: PreparedRoute) -> Policy:
        if route.policy is None or route.version != self.state.version:
            route.policy = _route_policy(self.state.policy, route.overrides)
            route.checks = route_checks(self.state.content, route.policy, route.overrides.content_checks)
            # A binary body's JSON is located by a header, read as one value like the others.
            content_read = (HEADER_JSON_LENGTH,) if route.checks is not None else ()
            route.read = read_headers(route.policy) | frozenset(content_read)
            route.version = self.state.version
        return route.policy

    async def request_filter(self, conf: PreparedRoute, request: HttpRequest, action: RequestAction) -> None:
        policy = self.policy_for(conf)
        read = self._read(conf, policy, request, action)
        if read is None:
            return
        features, tenant = read
        decided = await self._decide(conf, policy, features, tenant, request, action)
        if decided is None:
            return
        decision, kept_by = decided
        self._commit(decision, policy, features.model, kept_by, request)
        decision = await self._act(conf, decision, request, action)
        if self.state.config.audit.logger is not None:
            classification = features.headers.get(policy.classification_header)
            action.add_response_header(HEADER_AUDIT, audit_header(decision, features.model, classification))

    def _read(
        self, conf: PreparedRoute, policy: Policy, request: HttpRequest, action: RequestAction
    ) -> tuple[RequestFeatures, str | None] | None:
        """The request as the policy reads it, and its tenant; None when it was refused: a path or
        headers that layers could read two ways, or no consumer where the tenant is to be one."""
        headers = request.headers
        try:
            path = gateway_path(request.path)
        except PathError as exc:
            self._refuse(action, 400, str(exc))
            return None
        refusal = settle(request, conf.read, policy.tenant_header, action)
        if refusal is not None:
            self._refuse(action, refusal.status, refusal.message)
            return None
        decided = as_decided(headers, policy, headers.get(HEADER_CONSUMER))
        if decided is None:
            self._refuse(action, 401, _NO_CONSUMER)
            return None
        if policy.tenant_from_consumer:
            forget(request, policy.tenant_header, action)
        view, tenant = decided
        model = model_of(path)
        args = request.args
        features = RequestFeatures(
            path, view, {k: v or "" for k, v in args} if args else _NO_ARGS, model, body_bytes(headers)
        )
        return features, tenant

    async def _decide(
        self,
        conf: PreparedRoute,
        policy: Policy,
        features: RequestFeatures,
        tenant: str | None,
        request: HttpRequest,
        action: RequestAction,
    ) -> tuple[Decision, str | None] | None:
        """The decision, and the content detector that kept the request home if one did: where the
        route asks and the decision would send the request out, its text is read and it is decided
        again. None when the body was refused (the model server would read it otherwise than the
        checks did: a duplicate key)."""
        decision = decide(features, self.state.snapshot(tenant, features.model), policy)
        checks = conf.checks
        if not decision.is_cloud or checks is None or not checks.applies(policy, features):
            return decision, None
        content = checks.content
        verdict = await _read_content(content, request, features.body_bytes)
        if verdict.refusal is not None:
            self._refuse(action, 400, verdict.refusal)
            return None
        self.state.content_read(verdict)
        kept_by = None
        if content.keeps_home(verdict):
            features, kept_by = tightened(features, policy, content), verdict.label
        # Decided again, on the state as it is once the body has been read.
        return decide(features, self.state.snapshot(tenant, features.model), policy), kept_by

    def _commit(
        self, decision: Decision, policy: Policy, model: str | None, kept_by: str | None, request: HttpRequest
    ) -> None:
        """The decision into the books; a request residency kept home is noted with what it was
        (and the detector that kept it)."""
        seen = None
        if decision.residency_kept:
            seen = {
                "request_id": request.id,
                "path": request.path,
                "model": model,
                "classification": request.headers.get(policy.classification_header),
            }
            if kept_by is not None:
                seen["content"] = kept_by
        # A function invoked answers whole, however the model generates: an answer, not a stream.
        invoked = decision.is_cloud and self.state.target(decision.target).mode == "invoke"
        self.state.commit(decision, model, seen, streamed(request.path) and not invoked)

    async def _act(
        self, conf: PreparedRoute, decision: Decision, request: HttpRequest, action: RequestAction
    ) -> Decision:
        """What the decision asks of APISIX: shed, the cluster, or a target (its upstream, or the
        function called here). The decision the request ended with (a failed call ends otherwise)."""
        show = conf.overrides.decision_header
        if show if show is not None else self.state.decision_header:
            action.add_response_header(HEADER_DECISION, decision.shown)
        if decision.target == SHED:
            _shed(decision, action, self.policy_for(conf))
        elif decision.target == LOCAL:
            action.set_header(HEADER_TARGET, LOCAL)
            action.delete_header(HEADER_SIGNATURE)
            self._for_the_outcome(decision, action)
        elif self.state.target(decision.target).mode == "invoke":
            return await self._invoke(decision, request, action)
        else:
            await self._upstream(decision, request, action)
        return decision

    def _refuse(self, action: RequestAction, status: int, message: str) -> None:
        """A request no layer may read two ways is answered here, before anything decides on it."""
        headers = [("content-type", "application/json")]
        if self.state.config.audit.logger is not None:
            headers.append((HEADER_AUDIT, refused_header(status)))
        action.stop(status, json.dumps({"error": message}).encode(), headers)

    def _for_the_outcome(self, decision: Decision, action: RequestAction) -> None:
        """What the route's logger reports back with the outcome, through the edge's variables
        (which no client can write): the worker that decided and the tenant it counted, so the
        answer closes the books the decision opened whatever headers the upstream is sent."""
        if self.state.worker is not None:
            action.set_header(HEADER_WORKER, self.state.worker)
        if decision.tenant is not None:
            action.set_header(HEADER_TENANT, decision.tenant)

    async def _upstream(self, decision: Decision, request: HttpRequest, action: RequestAction) -> None:
        """Into traffic-split's cloud rule, with only the headers the target may receive."""
        name = decision.target
        forward_only(request, self.state.target(name).forwarded, action)
        action.set_header(HEADER_TARGET, self.state.route_value(name))
        self._for_the_outcome(decision, action)
        signer = self.state.signer(name)
        if signer.key is None:
            action.delete_header(HEADER_SIGNATURE)
            return
        target = _signed_target(request)
        body = await request.body() if signer.sign_body else None
        signature = signer.header(request.method, target, body)
        if signature is not None:
            action.set_fresh_header(HEADER_SIGNATURE, signature)

    async def _invoke(self, decision: Decision, request: HttpRequest, action: RequestAction) -> Decision:
        """Call the function; on failure, fall back to local (the request may stay, it may not leave).
        The decision the request ended with."""
        name = decision.target
        self.state.invoke_started(name)
        target = _signed_target(request)
        path, _, query = target.partition("?")
        body = await request.body()
        allowed = self.state.target(name).forwarded
        headers = {k: v for k, v in request.headers.items() if k in allowed and k != HEADER_TARGET}
        signature = self.state.signer(name).header(request.method, target, body)
        if signature is not None:
            headers[HEADER_SIGNATURE] = signature
        invoker = self._invokers.get(name)
        started = time.perf_counter()
        try:
            if invoker is None or self._pool is None:
                raise InvokeFailed(f"no invoker configured for target {name!r}")
            event = http_api_event(request.method, path, query, headers, body)
            answer = await self._pool.call(invoker, event, self.state.target(name).timeout_s)
        except InvokeFailed as exc:
            if self.state.invoke_failed(name):
                log.warning("invoke of %s failed: %s; retrying locally", name, exc)
                action.set_header(HEADER_TARGET, LOCAL)
                home = decision._replace(target=LOCAL, reason=Reason.INVOKE_FAILED, cost_usd=0.0)
                action.add_response_header(HEADER_DECISION, home.shown)
                return home
            log.warning("invoke of %s failed: %s; retry budget spent, shedding", name, exc)
            shed = decision._replace(
                target=SHED,
                reason=Reason.INVOKE_FAILED,
                status=503,
                retry_after_s=self.state.policy.retry_after_s,
            )
            _shed(shed, action, self.state.policy)
            return shed._replace(cost_usd=0.0)
        answer_headers = {k.lower(): v for k, v in answer.headers}
        seconds = time.perf_counter() - started
        self.state.invoke_answered(name, decision.tenant, answer.status, answer_headers, seconds)
        action.stop(answer.status, answer.body, answer.headers)
        return decision


async def _read_content(content: ContentPolicy, request: HttpRequest, declared: int | None) -> Verdict:
    """The verdict on a request's text; the body is asked of APISIX only when its declared size is
    within the bound (a larger one is not read at all)."""
    verdict = size_verdict(content, declared)
    if verdict is None:
        body = await request.body()
        verdict = body_verdict(content, body, request.headers.get(HEADER_JSON_LENGTH))
    return verdict


def body_bytes(headers: Mapping[str, str]) -> int | None:
    """The body's declared size: Content-Length, none without a body, unknown when chunked or
    malformed (so no target with a size limit takes it)."""
    declared = headers.get("content-length")
    if declared is None:
        return None if "transfer-encoding" in headers else 0
    declared = declared.strip()
    return int(declared) if declared.isascii() and declared.isdigit() else None


def _shed(decision: Decision, action: RequestAction, policy: Policy) -> None:
    """A refusal (a deadline or priority that says neither) or a shed the client may retry."""
    if decision.reason is Reason.ADMISSION_INVALID:
        body = json.dumps({"error": f"bad request ({decision.label}): {invalid_message(policy)}"})
        action.stop(decision.status, body.encode(), [("content-type", "application/json")])
        return
    body = json.dumps({"error": f"overloaded ({decision.label}); retry after {decision.retry_after_s} s"})
    action.stop(
        decision.status,
        body.encode(),
        [("content-type", "application/json"), ("retry-after", str(decision.retry_after_s))],
    )


def _signed_target(request: HttpRequest) -> str:
    """The target the function will verify, from the call alone (no round trip to APISIX): nginx's
    decoded path and argument table in the canonical form both sides sign."""
    args = [(_raw(k), _raw(v or "")) for k, v in request.args]
    return canonical_target(_raw(request.path), args)


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")
