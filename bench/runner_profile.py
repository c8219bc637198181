"""Where the runner's time goes per call, without sockets: one ext-plugin HTTP call decoded,
decided by the spillway plugin (local, or cloud through a rule) and its answer encoded, N times in
one process, with cProfile on or off. The socket, the framing and the event loop are
``bench/runner_throughput.py``'s and ``bench/apisix_gateway.py``'s to measure.

    python bench/runner_profile.py [--decision local|cloud] [--calls N] [--profile tottime|cumulative]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from typing import Any

from runner_throughput import HEADERS, SPILLWAY_CONFIG, shipped_plugins

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.protocol import encode, messages
from gateway_plugin.runner import Runner

PATH = "/v2/models/add_sub/infer"


class _NoPeer:
    """A connection no question is asked of: these calls need no ExtraInfo."""

    def ask(self, payload: bytes) -> Any:
        raise RuntimeError("the profiled call asked APISIX for more")


def caller(decision: str) -> Any:
    """One call, decided and answered, as a function of nothing."""
    os.environ.setdefault("SPILLWAY_SIGNING_KEY", "bench-signing-key")
    runner = Runner(shipped_plugins(SpillwayConfig.model_validate(SPILLWAY_CONFIG)))
    token = messages.conf_token(runner.prepare(encode.prepare_conf("bench", [("spillway", "{}")])))
    conf = runner.confs.get(token)
    assert conf is not None
    extra = [("x-want", "aws")] if decision == "cloud" else []
    payload = encode.req_call(1, token, 2, PATH, [], HEADERS + extra, bytes([10, 1, 2, 3]))
    peer = _NoPeer()

    def one() -> bytes:
        coro = runner.request(conf, messages.HttpReqCall(payload), peer)
        try:
            coro.send(None)
        except StopIteration as done:
            answer: bytes = done.value
            return answer
        raise RuntimeError("the call awaited something")

    return one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decision", choices=("local", "cloud"), default="local")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--profile", choices=("tottime", "cumulative"), default=None)
    args = parser.parse_args()
    one = caller(args.decision)
    for _ in range(2_000):
        one()
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    started = time.perf_counter()
    for _ in range(args.calls):
        one()
    took = time.perf_counter() - started
    if profile is not None:
        profile.disable()
        pstats.Stats(profile).sort_stats(args.profile).print_stats(30)
    print(f"{args.decision}: {took / args.calls * 1e6:.1f} µs per call (profiled: {bool(args.profile)})")


if __name__ == "__main__":
    main()
