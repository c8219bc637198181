"""Runner calls per second and latency against a framing-only echo server, in one run.

The echo server reads ext-plugin frames and answers each with a fixed frame: the ceiling of what
an asyncio Unix-socket server in Python does on this machine. The runner is measured with a no-op
plugin, a header-rewrite plugin and the spillway plugin (local decisions; cloud decisions signed
over UNSIGNED-PAYLOAD; cloud decisions signed over the body, fetched over ExtraInfo), at
concurrency 1, 4 and 16, with uvloop on and off. The load generator plays APISIX in its own
process and shares the machine's cores with the server.

    python bench/runner_throughput.py [--seconds 3] [--concurrency 1 4 16] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.plugin import HttpRequest, Plugin, RequestAction
from gateway_plugin.protocol import encode, messages, schema
from gateway_plugin.protocol.frames import FrameReader, FrameType, frame
from gateway_plugin.runner import Runner, serve


def shipped_plugins(config: SpillwayConfig) -> dict[str, Plugin[Any]]:
    """The plugins the runner serves for ``config`` (``spillway`` and ``headers``)."""
    from gateway_plugin.app import RunnerApp

    os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
    return RunnerApp(config).plugins


HEADERS = [
    ("host", "gateway.internal"),
    ("user-agent", "tritonclient/2.51"),
    ("content-type", "application/json"),
    ("content-length", "163"),
    ("accept", "*/*"),
    ("x-data-classification", "public"),
    ("x-tenant", "search"),
    ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
]
BODY = (
    b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]},'
    b'{"name":"INPUT1","shape":[1,4],"datatype":"FP32","data":[1,1,1,1]}]}'
)

Case = tuple[str, str, list[tuple[str, str]]]

# case → (plugin, its route conf, extra request headers)
CASES: dict[str, Case] = {
    "noop": ("noop", "{}", []),
    "header-rewrite": (
        "headers",
        '{"set": {"x-spillway-target": "aws"}, "response": {"x-spillway-decision": "aws;overflow"}}',
        [],
    ),
    "spillway-local": ("spillway", "{}", []),
    "spillway-cloud-unsigned-payload": ("spillway", "{}", [("x-want", "aws")]),
    "spillway-cloud-body-hash": ("spillway", "{}", [("x-want", "aws-hashed")]),
}

# A calm cluster keeps requests local; a rule sends x-want requests to an upstream-mode target
# whose signature covers UNSIGNED-PAYLOAD or the body.
SPILLWAY_CONFIG: dict[str, Any] = {
    "targets": [
        {"name": "aws", "kind": "aws_lambda", "url": "https://fn.example", "concurrency_cap": 1_000_000},
        {
            "name": "aws-hashed",
            "kind": "aws_lambda",
            "url": "https://fn.example",
            "sign_body": True,
            "concurrency_cap": 1_000_000,
        },
    ],
    "rules": [
        {"name": "a", "match": {"headers": {"x-want": "aws"}}, "action": "target", "targets": ["aws"]},
        {
            "name": "b",
            "match": {"headers": {"x-want": "aws-hashed"}},
            "action": "target",
            "targets": ["aws-hashed"],
        },
    ],
    "metrics": {"listen": None},
}


class Nothing(BaseModel):
    pass


class NoopPlugin(Plugin[Nothing]):
    name = "noop"
    config_model = Nothing

    async def request_filter(self, conf: Nothing, request: HttpRequest, action: RequestAction) -> None:
        return None


def _echo_server(sock: Path, use_uvloop: bool, ready: Any) -> None:
    answer = frame(FrameType.HTTP_REQ_CALL, encode.no_change(0))
    prepared = frame(FrameType.PREPARE_CONF, encode.prepare_conf_answer(1))

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.t, self.r = transport, FrameReader()

        def data_received(self, data: bytes) -> None:
            for ty, _ in self.r.feed(data):
                self.t.write(prepared if ty == FrameType.PREPARE_CONF else answer)

    async def main() -> None:
        await asyncio.get_running_loop().create_unix_server(Echo, str(sock))
        ready.set()
        await asyncio.Event().wait()

    _run(main(), use_uvloop)


def _runner_server(sock: Path, use_uvloop: bool, ready: Any) -> None:
    os.environ["SPILLWAY_SIGNING_KEY"] = "bench-signing-key"
    plugins: dict[str, Plugin[Any]] = {
        **shipped_plugins(SpillwayConfig.model_validate(SPILLWAY_CONFIG)),
        "noop": NoopPlugin(),
    }

    async def main() -> None:
        await serve(Runner(plugins), sock)
        ready.set()
        await asyncio.Event().wait()

    _run(main(), use_uvloop)


def _run(coro: Any, use_uvloop: bool) -> None:
    if use_uvloop:
        import uvloop

        uvloop.run(coro)
    else:
        asyncio.run(coro)


async def _client(sock: Path, case: Case, concurrency: int, seconds: float) -> list[float]:
    """Plays APISIX: one call at a time per connection, ExtraInfo questions answered in a loop."""
    latencies: list[float] = []
    name, value, extra = case
    answers = {
        schema.Info.VAR: frame(FrameType.EXTRA_INFO, encode.extra_info_answer(b"/v2/models/add_sub/infer")),
        schema.Info.REQ_BODY: frame(FrameType.EXTRA_INFO, encode.extra_info_answer(BODY)),
    }

    async def worker() -> None:
        reader, writer = await asyncio.open_unix_connection(str(sock))
        writer.write(frame(FrameType.PREPARE_CONF, encode.prepare_conf("bench", [(name, value)])))
        head = await reader.readexactly(4)
        token = messages.conf_token(await reader.readexactly(int.from_bytes(head[1:], "big")))
        payload = encode.req_call(
            1, token, 2, "/v2/models/add_sub/infer", [], HEADERS + extra, bytes([10, 1, 2, 3])
        )
        call = frame(FrameType.HTTP_REQ_CALL, payload)
        end = time.perf_counter() + seconds
        while (start := time.perf_counter()) < end:
            writer.write(call)
            while True:
                head = await reader.readexactly(4)
                length = int.from_bytes(head[1:], "big")
                answer = await reader.readexactly(length) if length else b""
                if head[0] != FrameType.EXTRA_INFO:
                    break
                writer.write(answers[messages.extra_info_request(answer)[0]])
            if head[0] != FrameType.HTTP_REQ_CALL:
                raise RuntimeError(f"error frame {head[0]}")
            latencies.append(time.perf_counter() - start)
        writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def _client_process(sock: Path, case: Case, concurrency: int, seconds: float, out: Any) -> None:
    import uvloop

    out.put(uvloop.run(_client(sock, case, concurrency, seconds)))


def measure(
    server: Callable[..., None], use_uvloop: bool, case: Case, concurrency: int, seconds: float
) -> dict[str, float]:
    sock = Path(tempfile.mkdtemp(prefix="spillway-bench-")) / "s.sock"
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    srv = ctx.Process(target=server, args=(sock, use_uvloop, ready), daemon=True)
    srv.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("server did not start")
        cli = ctx.Process(target=_client_process, args=(sock, case, concurrency, seconds, out))
        cli.start()
        lat = sorted(out.get(timeout=seconds + 60))
        cli.join()
    finally:
        srv.terminate()
        srv.join()
    return {
        "calls_per_s": len(lat) / seconds,
        "p50_us": lat[len(lat) // 2] * 1e6,
        "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
        "mean_us": statistics.fmean(lat) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell (default 3)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--uvloop", choices=["on", "off", "both"], default="both")
    parser.add_argument("--json", action="store_true", help="JSON lines (the default when not on a terminal)")
    args = parser.parse_args(argv)
    as_json = args.json or not sys.stdout.isatty()
    loops = {"on": [True], "off": [False], "both": [True, False]}[args.uvloop]
    for use_uvloop in loops:
        for c in args.concurrency:
            ceiling = measure(_echo_server, use_uvloop, CASES["noop"], c, args.seconds)
            noop = None
            for name in args.cases:
                got = measure(_runner_server, use_uvloop, CASES[name], c, args.seconds)
                noop = got if name == "noop" else noop
                row = {
                    "uvloop": use_uvloop,
                    "concurrency": c,
                    "case": name,
                    "echo_calls_per_s": round(ceiling["calls_per_s"]),
                    "calls_per_s": round(got["calls_per_s"]),
                    "of_echo": round(got["calls_per_s"] / ceiling["calls_per_s"], 3),
                    "of_noop": round(got["calls_per_s"] / noop["calls_per_s"], 3) if noop else None,
                    "p50_us": round(got["p50_us"], 1),
                    "p99_us": round(got["p99_us"], 1),
                    "echo_p99_us": round(ceiling["p99_us"], 1),
                }
                if as_json:
                    print(json.dumps(row), flush=True)
                else:
                    loop = "on " if use_uvloop else "off"
                    print(
                        f"uvloop={loop} c={c:<3} {name:<32} {row['calls_per_s']:>7}/s "
                        f"echo {row['echo_calls_per_s']:>7}/s  of echo {row['of_echo']:.2f}  "
                        f"of noop {row['of_noop'] or 0:.2f}  "
                        f"p50 {row['p50_us']:>7} µs  p99 {row['p99_us']:>7} µs",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
