"""One reading of every request, on a real Apache APISIX 3.18, on both paths: the ext-plugin route
(``spillway-edge`` + the runner) and the fast path (the ``spillway`` Lua plugin).

A client chooses every spelling of every header (case, ``_`` or ``-``, repeated) and every encoding
of its path; nginx, APISIX's route match, the runner or the plugin, traffic-split, the logger and
the upstream each read them. Each attack below was seen to change where a request went before
Spillway settled one reading at the edge; each is sent here through the real gateway, and a
property test sends generated ones, checking residency and the chosen target on both paths.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.contract import PathError, request_path, resolved_path
from gateway_plugin.books.target_header import target_value
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from testing.apisix import Stack, StackStarter, needs_apisix, spillway_route
from testing.http import wait_until
from testing.standins import StandIns

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
AWS = target_value("aws", TOKEN)
SIGNING_KEY = "edge-signing-key-0123456789abcdef"
EXT, FAST = "ext.test", "fast.test"
PATHS = (EXT, FAST)
INFER = "/v2/models/add_sub/infer"
SECRET = "/v2/models/secret/infer"
# Forwarded to the cloud by this test's target besides what inference needs.
TRACE = "x-trace-id"
# What APISIX's own nginx template adds to every proxied request (proxy_set_header): no plugin
# can remove them. They carry the connecting address, never a client's header.
ADDED_BY_APISIX = {"x-real-ip", "x-forwarded-for", "connection"}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def upstream(self) -> str | None:
        return self.body.get("upstream")

    def seen(self) -> list[tuple[str, str]]:
        """The headers the upstream received, as they came."""
        return [(k.lower(), v) for k, v in self.body.get("header_list", [])]


class Edge(Stack):
    """A ``Stack`` whose requests are sent byte for byte, to either path (by Host)."""

    def raw(
        self, host: str, path: str = INFER, headers: Sequence[tuple[str, str]] = (), body: bytes = b"{}"
    ) -> Answer:
        """The path as given, every header in the spelling and order given."""
        conn = http.client.HTTPConnection("127.0.0.1", int(self.gateway.url.rsplit(":", 1)[1]), timeout=30)
        try:
            conn.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", host)
            conn.putheader("Content-Type", "application/json")
            for name, value in headers:
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            answer = conn.getresponse()
            raw = answer.read()
            decoded = json.loads(raw) if raw.startswith(b"{") else {}
            return Answer(answer.status, {k.lower(): v for k, v in answer.getheaders()}, decoded)
        finally:
            conn.close()

    def overload(self) -> None:
        self.feed.queue_ms = 500
        for host in PATHS:
            wait_until(functools.partial(self.spills, host), 30, f"{host} spilling")

    def spills(self, host: str) -> bool:
        return self.raw(host, headers=[("X-Data-Classification", "public")]).upstream == "aws"


def routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Both paths on one APISIX (the fast path's by Host), each with an on-prem-only route for
    /v2/models/secret/* beside its general one."""
    validated = SpillwayConfig.model_validate(config)
    ext = spillway_route(config)
    secret = json.loads(json.dumps(ext))
    secret.update(id="ext-secret", uri="/v2/models/secret/*", priority=10)
    secret["plugins"]["ext-plugin-pre-req"]["conf"][0]["value"] = json.dumps({"on_prem_only": True})
    fast = {**fast_route(validated, TOKEN, "fast", "/v2/*"), "hosts": [FAST]}
    fast_secret = {
        **fast_route(validated, TOKEN, "fast-secret", "/v2/models/secret/*", {"on_prem_only": True}),
        "hosts": [FAST],
        "priority": 10,
    }
    return [yaml.safe_load(yaml.safe_dump(r)) for r in (ext, secret, fast, fast_secret)]


@pytest.fixture(scope="module")
def edge(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Edge:
    config = module_stand_ins.config("SPILLWAY_SIGNING_KEY")
    config["targets"][0]["forward_headers"] = [TRACE]
    config["targets"][0]["concurrency_cap"] = 3
    found = Edge.of(module_apisix_stack(config, routes(config), fast_path=True, signing_key=SIGNING_KEY))
    found.overload()
    return found


def _spellings(name: str) -> list[str]:
    return [
        name,
        name.upper(),
        name.replace("-", "_"),
        name.title().replace("-", "_"),
        name.replace("-", "_", 1),
    ]


def _own_headers_seen(answer: Answer) -> list[str]:
    return [
        k
        for k, _ in answer.seen()
        if k.replace("_", "-").startswith("x-spillway-") and k != "x-spillway-signature"
    ]


@pytest.mark.parametrize("host", PATHS)
def test_a_clients_target_header_in_any_spelling_never_picks_the_cloud(edge: Edge, host: str) -> None:
    """Before: ``X_Spillway_Target: aws:<MAC>`` on a confidential request reached the cloud (the
    runner and the plugin replaced only the dash spelling; traffic-split read the first of both)."""
    for classification in ("confidential", None):
        for spelling in _spellings("x-spillway-target"):
            for value in (AWS, "aws", "aws:" + "0" * 32):
                headers = [(spelling, value)]
                if classification:
                    headers.append(("X-Data-Classification", classification))
                answer = edge.raw(host, headers=headers)
                assert (answer.status, answer.upstream) == (200, "local"), (host, headers, answer)
                assert not _own_headers_seen(answer), answer.seen()


@pytest.mark.parametrize("host", PATHS)
def test_the_cloud_never_receives_the_decision_and_a_worker_header_never_leaves(
    edge: Edge, host: str
) -> None:
    """The target's value selected the upstream from the request's context; it is not a header a
    spilled request carries (before: every spilled request handed the static MAC'd value out)."""
    answer = edge.raw(host, headers=[("X-Data-Classification", "public"), ("X_Spillway_Worker", "123456789")])
    assert answer.upstream == "aws", answer
    assert not _own_headers_seen(answer), answer.seen()
    assert dict(answer.seen())["x-spillway-signature"].startswith("t=")


@pytest.mark.parametrize("host", PATHS)
@pytest.mark.parametrize(
    "labels",
    [
        [("X_Data_Classification", "confidential"), ("X-Data-Classification", "public")],
        [("X-Data-Classification", "public"), ("x_data_classification", "confidential")],
        [("X-Data-Classification", "public"), ("X-Data-Classification", "secret")],
        [("X-Data-Classification", "public"), ("X-Data-Classification", "public")],
    ],
)
def test_a_label_sent_twice_reads_as_the_stricter_at_every_layer(
    edge: Edge, host: str, labels: list[tuple[str, str]]
) -> None:
    """Before: ``X_Data_Classification: confidential`` + ``X-Data-Classification: public`` went to the
    cloud while nginx's own variable read ``confidential``. Now every layer reads one value, all
    labels joined, which is no single allowed class: the request stays home."""
    answer = edge.raw(host, headers=labels)
    assert answer.upstream == "local" and answer.headers["x-spillway-decision"] == "local;residency", answer
    seen = [v for k, v in answer.seen() if k.replace("_", "-") == "x-data-classification"]
    assert len(seen) == 1 and seen[0] == ", ".join(sorted_values(labels)), answer.seen()


def sorted_values(headers: list[tuple[str, str]]) -> list[str]:
    """Values of every spelling: spellings in sorted order, each one's values as they came."""
    by_spelling: dict[str, list[str]] = {}
    for name, value in headers:
        by_spelling.setdefault(name.lower(), []).append(value)
    return [v for name in sorted(by_spelling) for v in by_spelling[name]]


@pytest.mark.parametrize("host", PATHS)
@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/secre%2574/infer",
        "/v2/models/x/%252e%252e/secret/infer",
        "/v2/models/secret%252Finfer",
        "/v2/models/%2573ecret%252finfer",
    ],
)
def test_a_path_encoded_twice_is_refused_before_any_route_or_rule_reads_it(
    edge: Edge, host: str, path: str
) -> None:
    """Before: APISIX matched the general route on the once-decoded path while the runner, the
    signature and the function decoded up to four more times: the cloud served the on-prem-only
    model with a valid signature."""
    before = len(edge.aws.seen)
    answer = edge.raw(host, path=path, headers=[("X-Data-Classification", "public")])
    assert answer.status == 400 and "more than once" in answer.body["error"], answer
    assert len(edge.aws.seen) == before


@pytest.mark.parametrize("host", PATHS)
def test_a_path_encoded_once_is_matched_as_nginx_decodes_it(edge: Edge, host: str) -> None:
    """One encoding is the ordinary case: the route for the decoded path applies (on-prem only)."""
    for path in ("/v2/models/secre%74/infer", "/v2/models/%73ecret/./infer", "//v2/models/secret/infer"):
        answer = edge.raw(host, path=path, headers=[("X-Data-Classification", "public")])
        assert answer.upstream == "local" and answer.headers["x-spillway-decision"] == "local;residency", (
            answer
        )
        assert answer.body["path"] == SECRET, "the upstream is sent the path as decided, encoded once"


@pytest.mark.parametrize("host", PATHS)
def test_a_tenant_named_twice_differently_is_refused(edge: Edge, host: str) -> None:
    """Before: ``X-Tenant`` twice (or ``X_Tenant`` + ``X-Tenant``) bypassed a concurrency quota of 1:
    the runner joined the values, http-logger logged the first, the wrong tenant's slot was freed."""
    for headers in (
        [("X-Tenant", "alice"), ("X-Tenant", "bob")],
        [("X_Tenant", "alice"), ("X-Tenant", "bob")],
        [("x-tenant", "alice"), ("X-TENANT", "Alice"), ("X-Data-Classification", "public")],
    ):
        answer = edge.raw(host, headers=headers)
        assert answer.status == 400 and "different values" in answer.body["error"], (headers, answer)
    same = edge.raw(host, headers=[("X-Tenant", "carol"), ("X_Tenant", "carol")])
    assert same.status == 200, same
    assert [v for k, v in same.seen() if k.replace("_", "-") == "x-tenant"] == ["carol"], same.seen()


@pytest.mark.parametrize("host", PATHS)
def test_only_what_inference_needs_reaches_a_cloud_function(edge: Edge, host: str) -> None:
    """Before: Cookie, Proxy-Authorization, X-Api-Key went to the cloud function (only Authorization
    was dropped). Now an allow-list, closed by default, plus what the target adds (``x-trace-id``)."""
    credentials = [
        ("Cookie", "session=s3cret"),
        ("Proxy-Authorization", "Basic cHJveHk6czNjcmV0"),
        ("X-Api-Key", "k3y"),
        ("X_Api_Key", "k3y"),
        ("Authorization", "Bearer t0ken"),
        ("X-Forwarded-For", "10.1.2.3"),
        ("Forwarded", "for=10.1.2.5"),
        ("True-Client-IP", "10.1.2.6"),
        ("X-Custom", "internal"),
    ]
    needed = [
        ("X-Data-Classification", "public"),
        ("Inference-Header-Content-Length", "2"),
        ("X-Trace-Id", "abc"),
        ("Accept", "application/json"),
    ]
    answer = edge.raw(host, headers=credentials + needed)
    assert answer.upstream == "aws", answer
    seen = dict(answer.seen())
    allowed = {
        "host",
        "content-type",
        "content-length",
        "inference-header-content-length",
        "accept",
        TRACE,
        "x-spillway-signature",
    }
    assert set(seen) <= allowed | ADDED_BY_APISIX, sorted(set(seen) - allowed - ADDED_BY_APISIX)
    assert seen["inference-header-content-length"] == "2" and seen[TRACE] == "abc"
    # APISIX's template sets both to the address that connected to it (proxy_set_header, which no
    # plugin can change): that address, never one the client claimed, is what reaches a function.
    assert seen["x-forwarded-for"] == seen["x-real-ip"] == "127.0.0.1", (
        "the client's values do not travel; APISIX adds the peer's"
    )
    local = edge.raw(host, headers=credentials)
    assert local.upstream == "local" and dict(local.seen())["cookie"] == "session=s3cret", (
        "on-prem keeps them"
    )


@pytest.mark.parametrize("host", PATHS)
def test_the_client_address_a_cloud_function_sees_is_nginxs_remote_addr(edge: Edge, host: str) -> None:
    """The exposure no plugin can close: APISIX's template sets ``X-Real-IP`` and
    ``X-Forwarded-For`` from ``$remote_addr`` (``proxy_set_header``), which a plugin can neither
    change nor remove. That is the address that connected to the gateway or, from an address in
    ``real_ip_from`` (APISIX's default: loopback), the ``X-Real-IP`` it sent (nginx's realip
    module), as here: a proxy in front of the gateway passes the client's own address on."""

    def sees(sent: list[tuple[str, str]]) -> dict[str, str]:
        headers = [("X-Data-Classification", "public"), *sent]
        # The target's cap of 3 holds earlier tests' requests until their outcomes are in.
        wait_until(lambda: edge.raw(host, headers=headers).upstream == "aws", 10, "a request spilling")
        return {k.lower(): v for k, v in edge.aws.seen[-1]["header_list"]}

    seen = sees([])
    assert seen["x-real-ip"] == seen["x-forwarded-for"] == "127.0.0.1", seen
    seen = sees([("X-Real-IP", "192.0.2.7")])
    assert seen["x-real-ip"] == seen["x-forwarded-for"] == "192.0.2.7", seen


@pytest.mark.parametrize("host", PATHS)
def test_more_header_fields_than_the_runner_is_given_are_refused(edge: Edge, host: str) -> None:
    """APISIX hands the runner at most 100 headers; a classification hidden after 100 others would
    be read by nginx and not by the decision."""
    filler = [(f"X-Filler-{i}", "x") for i in range(100)]
    answer = edge.raw(host, headers=[*filler, ("X-Data-Classification", "public")])
    assert answer.status == 431 and "send at most 100" in answer.body["error"], (
        "the gateway's, not an upstream's"
    )
    assert edge.raw(host, headers=filler[:90]).status == 200


@pytest.mark.parametrize("host", PATHS)
def test_an_underscore_spelling_of_a_framing_header_is_refused(edge: Edge, host: str) -> None:
    for name in ("Content_Length", "transfer_encoding"):
        answer = edge.raw(host, headers=[(name, "5"), ("X-Data-Classification", "public")])
        assert answer.status == 400 and "frames the body" in answer.body["error"], answer


# ---------------------------------------------------------------------------------------------
# Generated requests: any spelling, any encoding, both paths.

CLASS_VALUES = ("public", "PUBLIC", " public ", "confidential", "secret", "")
OWN_VALUES = (AWS, "aws", "local", "aws:" + "0" * 32)


def _respelled(name: str, flips: list[bool]) -> str:
    """``name`` with each flipped character changed: a letter to upper case, a '-' to '_'."""
    return "".join(
        (c.upper() if c.isalpha() else "_" if c == "-" else c) if flip else c
        for c, flip in zip(name, flips, strict=True)
    )


def _spelled(name: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(lambda f: _respelled(name, f))


def _encode(path: str, choices: list[int]) -> str:
    """``path`` with its characters changed as ``choices`` say: 1 a letter or digit percent-encoded
    once, 2 twice, 3 a slash doubled, 4 a dot segment put after a slash."""
    out = []
    for c, how in zip(path, choices, strict=True):
        if c == "/" and how in (3, 4):
            out.append("//" if how == 3 else "/./")
        elif c.isalnum() and how in (1, 2):
            out.append(f"%{ord(c):02X}" if how == 1 else f"%25{ord(c):02X}")
        else:
            out.append(c)
    return "".join(out)


def _encoded(path: str) -> st.SearchStrategy[str]:
    """Mostly encoded once (or not at all), sometimes with dot segments or doubled slashes, and now
    and then encoded twice somewhere."""
    mode = st.sampled_from(([0], [0, 1], [0, 0, 0, 1, 3, 4], [0] * 12 + [2]))
    return mode.flatmap(
        lambda kinds: st.lists(st.sampled_from(kinds), min_size=len(path), max_size=len(path))
    ).map(lambda choices: _encode(path, choices))


_label = st.tuples(_spelled("x-data-classification"), st.sampled_from(CLASS_VALUES))
request_strategy = st.fixed_dictionaries(
    {
        "path": st.sampled_from((INFER, INFER, SECRET)).flatmap(_encoded),
        "labels": st.one_of(st.lists(_label, min_size=1, max_size=1), st.lists(_label, max_size=3)),
        "own": st.lists(
            st.tuples(
                st.sampled_from(("x-spillway-target", "x-spillway-worker", "x-spillway-signature")).flatmap(
                    _spelled
                ),
                st.sampled_from(OWN_VALUES),
            ),
            max_size=2,
        ),
    }
)


def predicted(request: dict[str, Any]) -> tuple[int, str | None]:
    """What one reading says: no route (404) unless nginx's reading of the path is under /v2/; 400
    for a path encoded twice; local for the on-prem-only route and for anything not labelled exactly
    one allowed class; else the cloud (the stack is overloaded)."""
    once = resolved_path(unquote(request["path"]))
    if not once.startswith("/v2/"):
        return 404, None
    try:
        path = request_path(request["path"])
    except PathError:
        return 400, None
    values = [v for _, v in request["labels"]]
    leaves = len(values) == 1 and values[0].strip().lower() == "public"
    if path.startswith("/v2/models/secret/") or not leaves:
        return 200, "local"
    return 200, "aws"


@settings(max_examples=200, deadline=None)
@given(request=request_strategy)
def test_generated_spellings_and_encodings_keep_residency_and_reach_the_predicted_target(
    edge: Edge, request: dict[str, Any]
) -> None:
    headers = [*request["labels"], *request["own"]]
    want = predicted(request)
    for host in PATHS:
        answer = edge.raw(host, path=request["path"], headers=headers)
        assert (answer.status, answer.upstream) == want, (host, request, answer)
        if answer.upstream is None:
            continue
        assert not _own_headers_seen(answer), (host, request, answer.seen())
        labels = [v for k, v in answer.seen() if k.replace("_", "-") == "x-data-classification"]
        assert len(labels) <= 1, ("one reading reaches the upstream", host, request, answer.seen())


# ---------------------------------------------------------------------------------------------
# Last: opens the cloud target's breaker for the rest of the module.


def test_a_clients_worker_header_cannot_lose_the_outcomes_that_open_a_breaker(edge: Edge) -> None:
    """Before: ``X-Spillway-Worker: 123456789`` (9 characters), copied by http-logger, made the runner
    refuse each entry: the cloud's 503s never opened the breaker, in-flight counts leaked, and every
    public request then went ``local;no_target``. The worker now comes from the edge's variable."""
    edge.aws.status = 503
    try:
        for _ in range(3):
            answer = edge.raw(
                EXT, headers=[("X-Data-Classification", "public"), ("X-Spillway-Worker", "123456789")]
            )
            assert answer.upstream == "aws" and answer.status == 503, answer
        wait_until(
            lambda: 'spillway_breaker_open{target="aws"} 1.0' in edge.metrics(), 30, "the breaker open"
        )
        in_flight = re.search(r'spillway_target_in_flight\{target="aws"\} ([0-9.]+)', edge.metrics())
        assert in_flight is not None and float(in_flight.group(1)) == 0.0, "no in-flight count leaked"
    finally:
        edge.aws.status = 200
