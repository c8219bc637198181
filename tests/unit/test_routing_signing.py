"""Upstream mode's signature, made by the runner from the call alone: it verifies at the function
against the raw target APISIX forwards, and costs no ExtraInfo round trip unless the body is hashed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from devtools.apisix_peer import ApisixPeer, PeerRequest, RouteConf
from functions.signature import SignatureError, Verifier
from gateway_plugin.app import RunnerApp
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.runner import Runner, serve
from testing.function import ADD_SUB_BODY

KEY = "a-signing-key-for-the-runner-tests-0123456789"
ROUTE = RouteConf("route#spillway", [("spillway", "{}")])
# What nginx hands the runner for ``/v2/models/add_%73ub/infer?b=2&a=x+y&flag`` ...
CALL = PeerRequest(
    "POST",
    "/v2/models/add_sub/infer",
    args=[("b", "2"), ("a", "x y"), ("flag", None)],
    headers=[("x-data-classification", "public"), ("x-want", "aws")],
    body=ADD_SUB_BODY,
)
# ... and what APISIX forwards to the function, which checks the signature against it.
FORWARDED = "/v2/models/add_%73ub/infer?b=2&a=x+y&flag"


def _config(sign_body: bool) -> SpillwayConfig:
    return SpillwayConfig.model_validate(
        {
            "targets": [
                {
                    "name": "aws",
                    "kind": "http",
                    "url": "http://127.0.0.1:9",
                    "signing_key_env": "SPILLWAY_TEST_SIGNING_KEY",
                    "sign_body": sign_body,
                }
            ],
            "rules": [
                {
                    "name": "out",
                    "match": {"headers": {"x-want": "aws"}},
                    "action": "target",
                    "targets": ["aws"],
                }
            ],
            "metrics": {"listen": None},
        }
    )


async def _signed(sign_body: bool, tmp: Path) -> tuple[str, int]:
    app = RunnerApp(_config(sign_body), None)
    server = await serve(Runner(app.plugins), tmp / "runner.sock")
    peer = ApisixPeer(tmp / "runner.sock")
    try:
        outcome = await peer.request(ROUTE, CALL)
    finally:
        await peer.close()
        app.close()
        server.close()
    assert outcome.rewrite is not None, outcome
    return dict(outcome.rewrite.headers)["x-spillway-signature"], peer.extra_info_asked


@pytest.mark.parametrize(("sign_body", "round_trips"), [(False, 0), (True, 1)])
def test_the_runners_signature_verifies_against_the_forwarded_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sign_body: bool, round_trips: int
) -> None:
    monkeypatch.setenv("SPILLWAY_TEST_SIGNING_KEY", KEY)
    signature, asked = asyncio.run(_signed(sign_body, tmp_path))
    assert asked == round_trips, "only a hashed body is fetched from APISIX"
    Verifier(KEY.encode(), allow_unsigned_payload=not sign_body).verify(
        signature, "POST", FORWARDED, ADD_SUB_BODY, float(signature.split(",")[0][2:])
    )
    with pytest.raises(SignatureError, match="wrong"):
        Verifier(KEY.encode(), allow_unsigned_payload=True).verify(
            signature, "POST", FORWARDED + "&extra=1", ADD_SUB_BODY, float(signature.split(",")[0][2:])
        )
