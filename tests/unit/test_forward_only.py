"""What a spilled request may carry to a function: only the headers its target allows, each in the
one spelling the function reads (``forward_only``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway_plugin.plugin import HttpRequest, RequestAction
from gateway_plugin.protocol import encode, messages
from gateway_plugin.request.reading import forward_only

ALLOWED = frozenset({"content-type", "traceparent"})
NAMES = [
    "content-type",
    "Content-Type",
    "content_type",
    "Content_Type",
    "traceparent",
    "x-api-key",
    "X_Api_Key",
]


@given(st.lists(st.tuples(st.sampled_from(NAMES), st.text("abc", max_size=3)), max_size=6))
def test_only_allowed_headers_in_their_dash_spelling_are_left(headers: list[tuple[str, str]]) -> None:
    """Every spelling a client sent that is not an allowed name as written is deleted: a header in
    one spelling each (the usual request), repeated, or with ``_`` for ``-``."""
    call = messages.HttpReqCall(encode.req_call(1, 1, 2, "/v2/models/m/infer", [], headers, bytes(4)))
    request = HttpRequest(call, None)  # type: ignore[arg-type]  # nothing is asked of APISIX
    action = RequestAction(request)
    forward_only(request, ALLOWED, action)
    _, rewrite = messages.req_call_answer(action.encode(1))
    rewritten = rewrite.headers if isinstance(rewrite, messages.Rewrite) else []
    deleted = {name for name, value in rewritten if value is None}
    left = {name.lower() for name, _ in headers} - deleted
    assert left <= ALLOWED, (headers, left)
