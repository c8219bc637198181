"""The function's hand-written HTTP server and sidecar client against aiohttp, uvicorn and httpx.

``servers``: the function's HTTP server (``functions.http_server``, on uvloop, default
``HttpLimits``) against aiohttp's low-level ``web.Server``, an aiohttp ``Application`` with one
catch-all handler, and uvicorn running a raw ASGI app on uvloop with httptools and with h11. Each
stack runs in its own process with the same handler work: ``POST /echo`` answers the request body
(100 bytes), and ``POST /v2/models/add_sub/infer`` forwards the body and its content type to a real
Triton sidecar through ``UpstreamPool`` and answers Triton's status, content type and body. wrk
(one thread, keep-alive connections, closed loop) is the load generator for every stack.

``clients``: ``functions.sidecar_client.UpstreamPool`` against ``aiohttp.ClientSession`` (a
keep-alive ``TCPConnector``) and ``httpx.AsyncClient``, each in its own process on uvloop, with
the same closed loop: N coroutines POST the ``add_sub`` JSON inference and read the whole answer,
to a real Triton sidecar and to a trivial local HTTP server that answers Triton's bytes. Each
client sends only Host, Content-Type and Content-Length (no Accept-Encoding: the answer comes
back byte for byte), and its first answer is checked against Triton's.

Both compare what they compare in one run: every round measures each cell once per
alternative, in an order rotated between rounds, on a 2-core shared machine. Figures are medians
over rounds; ratios are medians of per-round ratios against the hand-written piece measured in
the same round. CPU per request is the process's user+system time over the requests it served.

    python bench/http_stack.py servers [--rounds 5] [--seconds 2] [--json-out F] [--markdown-out F]
    python bench/http_stack.py clients [--rounds 5] [--seconds 2] [--json-out F] [--markdown-out F]

Needs ``wrk`` on PATH (servers) and ``pip install uvicorn httpx`` (aiohttp comes with tritonclient).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from harness import (
    EXAMPLE_REPOSITORY,
    LOOPBACK,
    ROOT,
    Launched,
    Output,
    add_output_options,
    cpu_seconds,
    descendants,
    free_port,
    http_call,
    launch,
    machine_note,
    median,
    poll,
    render_table,
    running,
    say,
)

ECHO_PATH = "/echo"
INFER_PATH = "/v2/models/add_sub/infer"
ECHO_BODY = bytes(range(100))
# testing/function.py ADD_SUB_BODY: what the function's own tests send.
ADD_SUB_BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]},
        ]
    }
).encode()
JSON = "application/json"
TIMEOUT_S = 60.0
MAX_BODY = 32 * 1024 * 1024
# What functions.core forwards each way.
FORWARD_REQUEST_HEADERS = (
    "content-type",
    "inference-header-content-length",
    "accept-encoding",
    "content-encoding",
)
FORWARD_RESPONSE_HEADERS = frozenset(
    (b"content-type", b"inference-header-content-length", b"content-encoding")
)

SERVER_STACKS = ("spillway", "aiohttp-server", "aiohttp-app", "uvicorn-httptools", "uvicorn-h11")
SERVER_BASELINE = "spillway"
WORKLOADS = {
    "echo": (ECHO_PATH, ECHO_BODY, "application/octet-stream"),
    "forward": (INFER_PATH, ADD_SUB_BODY, JSON),
}
CLIENTS = ("spillway", "aiohttp", "httpx")
CLIENT_BASELINE = "spillway"
CLIENT_TARGETS = ("triton", "trivial")


# ---------------------------------------------------------------------------------------------
# Server processes (``_serve``): one stack, both workloads, until SIGTERM.


def _upstream(port: int) -> Any:
    from functions.sidecar_client import UpstreamPool

    return UpstreamPool(LOOPBACK, port) if port else None


async def _serve_spillway(port: int, upstream_port: int) -> None:
    from functions import http_server
    from functions.http_types import Request, Response
    from functions.settings import HttpLimits

    pool = _upstream(upstream_port)

    async def handler(request: Request) -> Response:
        if request.path == ECHO_PATH:
            return Response(200, [("content-type", "application/octet-stream")], bytes(request.body))
        headers = [
            (name.encode(), request.headers[name].encode("latin-1"))
            for name in FORWARD_REQUEST_HEADERS
            if name in request.headers
        ]
        up = await pool.request(request.method, request.target, headers, request.body, TIMEOUT_S)
        kept = [(k.decode(), v.decode("latin-1")) for k, v in up.headers if k in FORWARD_RESPONSE_HEADERS]
        return Response(up.status, kept, up.body)

    await http_server.serve(handler, LOOPBACK, port, MAX_BODY, HttpLimits())
    await asyncio.Event().wait()


def _aiohttp_handler(upstream_port: int) -> Callable[[Any], Awaitable[Any]]:
    from aiohttp import web

    pool = _upstream(upstream_port)

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        if request.path == ECHO_PATH:
            return web.Response(body=body, content_type="application/octet-stream")
        headers = [
            (name.encode(), value.encode("latin-1"))
            for name in FORWARD_REQUEST_HEADERS
            if (value := request.headers.get(name)) is not None
        ]
        up = await pool.request(request.method, request.raw_path, headers, body, TIMEOUT_S)
        kept = {k.decode(): v.decode("latin-1") for k, v in up.headers if k in FORWARD_RESPONSE_HEADERS}
        return web.Response(status=up.status, headers=kept, body=up.body)

    return handler


# The function's HttpLimits, as far as each alternative has a knob for them.
_AIOHTTP_LIMITS: dict[str, Any] = {
    "keepalive_timeout": 75.0,
    "max_headers": 100,
    "max_line_size": 64 * 1024,
    "max_field_size": 64 * 1024,
    "access_log": None,
}


async def _serve_aiohttp_server(port: int, upstream_port: int) -> None:
    from aiohttp import web

    server = web.Server(_aiohttp_handler(upstream_port), **_AIOHTTP_LIMITS)
    await asyncio.get_running_loop().create_server(server, LOOPBACK, port, reuse_address=True, backlog=1024)
    await asyncio.Event().wait()


async def _serve_aiohttp_app(port: int, upstream_port: int) -> None:
    from aiohttp import web

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_route("*", "/{tail:.*}", _aiohttp_handler(upstream_port))
    runner = web.AppRunner(app, **_AIOHTTP_LIMITS)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, port, backlog=1024, reuse_address=True).start()
    await asyncio.Event().wait()


def _asgi_app(upstream_port: int) -> Callable[..., Awaitable[None]]:
    pool = _upstream(upstream_port)
    wanted = {name.encode() for name in FORWARD_REQUEST_HEADERS}

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if scope["path"] == ECHO_PATH:
            status, headers, out = 200, [(b"content-type", b"application/octet-stream")], body
        else:
            forward = [(k, v) for k, v in scope["headers"] if k in wanted]
            target = scope["raw_path"].decode("latin-1")
            if scope["query_string"]:
                target += "?" + scope["query_string"].decode("latin-1")
            up = await pool.request(scope["method"], target, forward, body, TIMEOUT_S)
            status, out = up.status, up.body
            headers = [(k, v) for k, v in up.headers if k in FORWARD_RESPONSE_HEADERS]
        headers.append((b"content-length", b"%d" % len(out)))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    return app


def _serve_uvicorn(port: int, upstream_port: int, http: str) -> None:
    import uvicorn

    config = uvicorn.Config(
        _asgi_app(upstream_port),
        host=LOOPBACK,
        port=port,
        loop="uvloop",
        http=http,
        lifespan="off",
        access_log=False,
        log_level="warning",
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_keep_alive=75,
        limit_concurrency=1024,
        backlog=1024,
        h11_max_incomplete_event_size=64 * 1024,
    )
    uvicorn.Server(config).run()


class _Trivial(asyncio.Protocol):
    """Answers every request with fixed bytes: the far end for the client comparison."""

    answer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import httptools

        self.transport: Any = transport
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.transport.write(self.answer)


async def _serve_trivial(port: int, answer: bytes) -> None:
    _Trivial.answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(answer),
        answer,
    )
    await asyncio.get_running_loop().create_server(_Trivial, LOOPBACK, port, reuse_address=True, backlog=1024)
    await asyncio.Event().wait()


def serve_one(stack: str, port: int, upstream_port: int, answer_file: Path | None) -> int:
    import uvloop

    if stack.startswith("uvicorn-"):
        _serve_uvicorn(port, upstream_port, stack.removeprefix("uvicorn-"))
        return 0
    mains: dict[str, Callable[[int, int], Awaitable[None]]] = {
        "spillway": _serve_spillway,
        "aiohttp-server": _serve_aiohttp_server,
        "aiohttp-app": _serve_aiohttp_app,
    }
    if stack == "trivial":
        assert answer_file is not None
        uvloop.run(_serve_trivial(port, answer_file.read_bytes()))
    else:
        uvloop.run(mains[stack](port, upstream_port))  # type: ignore[arg-type]
    return 0


def start_server(
    launched: list[Launched], work: Path, stack: str, upstream_port: int, answer_file: Path | None = None
) -> tuple[Launched, int]:
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "_serve", stack, "--port", str(port)]
    cmd += ["--upstream-port", str(upstream_port)]
    if answer_file is not None:
        cmd += ["--answer-file", str(answer_file)]
    proc = launch(cmd, dict(os.environ), work / f"{stack}.log")
    launched.append(proc)
    path, body, ctype = WORKLOADS["echo"] if stack != "trivial" else WORKLOADS["forward"]
    poll(
        lambda: http_call(port, "POST", path, body, {"content-type": ctype})[0] == 200,
        30,
        0.05,
        lambda: not proc.exited(),
    )
    return proc, port


# ---------------------------------------------------------------------------------------------
# The Triton sidecar both comparisons forward to.


@contextlib.contextmanager
def triton_sidecar(work: Path) -> Any:
    from functions.sidecar import Sidecar, SidecarOptions

    repository = work / "models"
    shutil.copytree(EXAMPLE_REPOSITORY, repository)
    sidecar = Sidecar(SidecarOptions(repository, ("add_sub",), 60, log_path=work / "triton.log"))
    say("starting a Triton sidecar with add_sub")
    sidecar.start()
    try:
        sidecar.wait_ready(90)
        status, answer = http_call(
            sidecar.http_port, "POST", INFER_PATH, ADD_SUB_BODY, {"content-type": JSON}
        )
        if status != 200:
            raise RuntimeError(f"Triton answered {status}: {answer[:200]!r}")
        yield sidecar, answer
    finally:
        sidecar.stop()


def tree_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    return cpu_seconds(pid) + sum(cpu_seconds(p) for p in descendants(pid))


# ---------------------------------------------------------------------------------------------
# servers: wrk against each stack.

_WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "%(ctype)s"
wrk.body = %(body)s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\\"requests\\":%%d,\\"duration_us\\":%%d,\\"errors\\":%%d,\\"non2xx\\":%%d," ..
    "\\"p50_us\\":%%d,\\"p99_us\\":%%d,\\"mean_us\\":%%f}\\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency.mean))
end
"""


def _lua_string(data: bytes) -> str:
    return '"' + "".join(f"\\{b:03d}" for b in data) + '"'


def wrk_scripts(work: Path) -> dict[str, Path]:
    scripts = {}
    for name, (_, body, ctype) in WORKLOADS.items():
        path = work / f"{name}.lua"
        path.write_text(_WRK_SCRIPT % {"ctype": ctype, "body": _lua_string(body)})
        scripts[name] = path
    return scripts


def run_wrk(url: str, concurrency: int, seconds: int, script: Path) -> dict[str, float]:
    cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--timeout", "5s", "-s", str(script), url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    for line in done.stdout.splitlines():
        if line.startswith("WRKJSON "):
            got: dict[str, float] = json.loads(line.removeprefix("WRKJSON "))
            return got
    raise RuntimeError(f"wrk gave no result: {done.stdout[-500:]} {done.stderr[-500:]}")


@dataclass(frozen=True)
class ServerSample:
    kind: str
    round: int
    workload: str
    stack: str
    concurrency: int
    requests: int
    req_per_s: float
    p50_us: float
    p99_us: float
    errors: int
    server_cpu_us_per_req: float
    triton_cpu_us_per_req: float


def measure_server(
    stack: str,
    server: Launched,
    port: int,
    workload: str,
    concurrency: int,
    rnd: int,
    seconds: int,
    script: Path,
    triton_pid: int | None,
) -> ServerSample:
    path = WORKLOADS[workload][0]
    server_cpu0, triton_cpu0 = cpu_seconds(server.proc.pid), tree_cpu(triton_pid)
    got = run_wrk(f"http://{LOOPBACK}:{port}{path}", concurrency, seconds, script)
    server_cpu = cpu_seconds(server.proc.pid) - server_cpu0
    triton_cpu = tree_cpu(triton_pid) - triton_cpu0 if workload == "forward" else 0.0
    n = int(got["requests"]) or 1
    return ServerSample(
        "sample",
        rnd,
        workload,
        stack,
        concurrency,
        int(got["requests"]),
        got["requests"] / (got["duration_us"] / 1e6),
        got["p50_us"],
        got["p99_us"],
        int(got["errors"] + got["non2xx"]),
        server_cpu / n * 1e6,
        triton_cpu / n * 1e6,
    )


def rotated(items: Sequence[str], by: int) -> list[str]:
    by %= len(items)
    return [*items[by:], *items[:by]]


def summarise_servers(samples: list[ServerSample], stacks: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    cells = sorted(
        {(s.workload, s.concurrency) for s in samples}, key=lambda c: (list(WORKLOADS).index(c[0]), c[1])
    )
    for workload, conc in cells:
        cell = [s for s in samples if s.workload == workload and s.concurrency == conc]
        base = {s.round: s for s in cell if s.stack == SERVER_BASELINE}
        for stack in stacks:
            mine = [s for s in cell if s.stack == stack]
            paired = [(s, base[s.round]) for s in mine if s.round in base]
            rows.append(
                {
                    "kind": "summary",
                    "part": "servers",
                    "workload": workload,
                    "concurrency": conc,
                    "stack": stack,
                    "rounds": len(mine),
                    "req_per_s": median([s.req_per_s for s in mine]),
                    "ratio": median([s.req_per_s / b.req_per_s for s, b in paired]),
                    "p50_us": median([s.p50_us for s in mine]),
                    "p99_us": median([s.p99_us for s in mine]),
                    "server_cpu_us_per_req": median([s.server_cpu_us_per_req for s in mine]),
                    "cpu_ratio": median(
                        [s.server_cpu_us_per_req / b.server_cpu_us_per_req for s, b in paired]
                    ),
                    "triton_cpu_us_per_req": median([s.triton_cpu_us_per_req for s in mine])
                    if workload == "forward"
                    else float("nan"),
                    "errors": sum(s.errors for s in mine),
                }
            )
    return rows


def run_servers(args: argparse.Namespace, out: Output, work: Path) -> list[dict[str, Any]]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not on PATH (apt-get install wrk)")
    scripts = wrk_scripts(work)
    samples: list[ServerSample] = []
    with triton_sidecar(work) as (sidecar, triton_answer), running([]) as launched:
        servers = {}
        for stack in args.stacks:
            say(f"starting {stack}")
            servers[stack] = start_server(launched, work, stack, sidecar.http_port)
            got = http_call(servers[stack][1], "POST", INFER_PATH, ADD_SUB_BODY, {"content-type": JSON})
            if got != (200, triton_answer):
                raise RuntimeError(f"{stack} forwarded {got[0]} {got[1][:200]!r}, not Triton's answer")
        say("warming up every stack")
        for _, port in servers.values():
            for workload, script in scripts.items():
                run_wrk(f"http://{LOOPBACK}:{port}{WORKLOADS[workload][0]}", max(args.concurrency), 1, script)
        total = args.rounds * len(args.workloads) * len(args.concurrency) * len(args.stacks)
        done = 0
        for rnd in range(args.rounds):
            for workload in args.workloads:
                for conc in args.concurrency:
                    for stack in rotated(args.stacks, rnd):
                        proc, port = servers[stack]
                        s = measure_server(
                            stack,
                            proc,
                            port,
                            workload,
                            conc,
                            rnd,
                            args.seconds,
                            scripts[workload],
                            sidecar.pid,
                        )
                        samples.append(s)
                        out.record(asdict(s))
                        done += 1
                        say(
                            f"[{done}/{total}] round {rnd + 1} {workload} c={conc} {stack}: "
                            f"{s.req_per_s:,.0f}/s p50 {s.p50_us:.0f} µs p99 {s.p99_us:.0f} µs "
                            f"cpu {s.server_cpu_us_per_req:.0f} µs/req"
                            + (f" ERRORS {s.errors}" if s.errors else "")
                        )
    return summarise_servers(samples, args.stacks)


# ---------------------------------------------------------------------------------------------
# clients: each library in its own process, driven over a pipe.


class _Spillway:
    def __init__(self, port: int) -> None:
        from functions.sidecar_client import UpstreamPool

        self.pool = UpstreamPool(LOOPBACK, port)
        self.headers = [(b"content-type", JSON.encode())]

    async def call(self) -> tuple[int, bytes]:
        r = await self.pool.request("POST", INFER_PATH, self.headers, ADD_SUB_BODY, TIMEOUT_S)
        return r.status, r.body

    async def close(self) -> None:
        self.pool.close()


class _Aiohttp:
    def __init__(self, port: int) -> None:
        import aiohttp

        self.url = f"http://{LOOPBACK}:{port}{INFER_PATH}"
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
        )
        self.headers = {"content-type": JSON}

    async def call(self) -> tuple[int, bytes]:
        async with self.session.post(self.url, data=ADD_SUB_BODY, headers=self.headers) as r:
            return r.status, await r.read()

    async def close(self) -> None:
        await self.session.close()


class _Httpx:
    def __init__(self, port: int) -> None:
        import httpx

        self.url = f"http://{LOOPBACK}:{port}{INFER_PATH}"
        self.client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=60),
            timeout=TIMEOUT_S,
        )
        for name in ("accept", "accept-encoding", "user-agent", "connection"):
            del self.client.headers[name]
        self.headers = {"content-type": JSON}

    async def call(self) -> tuple[int, bytes]:
        r = await self.client.post(self.url, content=ADD_SUB_BODY, headers=self.headers)
        return r.status_code, r.content

    async def close(self) -> None:
        await self.client.aclose()


_CLIENT_CLASSES: dict[str, Callable[[int], Any]] = {
    "spillway": _Spillway,
    "aiohttp": _Aiohttp,
    "httpx": _Httpx,
}


async def _closed_loop(
    client: Any, concurrency: int, seconds: float
) -> tuple[list[float], int, float, float]:
    latencies: list[float] = []
    errors = 0
    end = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        clock = time.perf_counter
        while (start := clock()) < end:
            status, _ = await client.call()
            latencies.append(clock() - start)
            if status != 200:
                errors += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors, time.process_time() - cpu0, time.perf_counter() - wall0


async def _make_client(name: str, port: int) -> Any:
    """Inside the loop: aiohttp binds its connector to the running loop."""
    return _CLIENT_CLASSES[name](port)


def client_worker(name: str, conn: Connection) -> None:
    """One library, one loop; answers ``(port, concurrency, seconds, warmup_s)`` until ``None``."""
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    clients: dict[int, Any] = {}
    try:
        while (command := conn.recv()) is not None:
            port, concurrency, seconds, warmup_s, expected = command
            try:
                if port not in clients:
                    clients[port] = loop.run_until_complete(_make_client(name, port))
                    status, body = loop.run_until_complete(clients[port].call())
                    if (status, body) != (200, expected):
                        raise RuntimeError(f"first answer {status} {body[:200]!r} is not Triton's")
                loop.run_until_complete(_closed_loop(clients[port], concurrency, warmup_s))
                measured = _closed_loop(clients[port], concurrency, seconds)
                lat, errors, cpu, wall = loop.run_until_complete(measured)
            except Exception as exc:
                conn.send({"error": f"{name}: {exc!r}"})
                continue
            lat.sort()
            conn.send(
                {
                    "requests": len(lat),
                    "req_per_s": len(lat) / wall,
                    "p50_us": lat[len(lat) // 2] * 1e6,
                    "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
                    "errors": errors,
                    "client_cpu_us_per_req": cpu / max(1, len(lat)) * 1e6,
                }
            )
    finally:
        for client in clients.values():
            loop.run_until_complete(client.close())
        loop.close()


@dataclass(frozen=True)
class ClientSample:
    kind: str
    round: int
    target: str
    client: str
    concurrency: int
    requests: int
    req_per_s: float
    p50_us: float
    p99_us: float
    errors: int
    client_cpu_us_per_req: float
    server_cpu_us_per_req: float


def summarise_clients(samples: list[ClientSample], clients: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    cells = sorted(
        {(s.target, s.concurrency) for s in samples}, key=lambda c: (CLIENT_TARGETS.index(c[0]), c[1])
    )
    for target, conc in cells:
        cell = [s for s in samples if s.target == target and s.concurrency == conc]
        base = {s.round: s for s in cell if s.client == CLIENT_BASELINE}
        for client in clients:
            mine = [s for s in cell if s.client == client]
            paired = [(s, base[s.round]) for s in mine if s.round in base]
            rows.append(
                {
                    "kind": "summary",
                    "part": "clients",
                    "target": target,
                    "concurrency": conc,
                    "client": client,
                    "rounds": len(mine),
                    "req_per_s": median([s.req_per_s for s in mine]),
                    "ratio": median([s.req_per_s / b.req_per_s for s, b in paired]),
                    "p50_us": median([s.p50_us for s in mine]),
                    "p99_us": median([s.p99_us for s in mine]),
                    "client_cpu_us_per_req": median([s.client_cpu_us_per_req for s in mine]),
                    "cpu_ratio": median(
                        [s.client_cpu_us_per_req / b.client_cpu_us_per_req for s, b in paired]
                    ),
                    "server_cpu_us_per_req": median([s.server_cpu_us_per_req for s in mine]),
                    "errors": sum(s.errors for s in mine),
                }
            )
    return rows


def run_clients(args: argparse.Namespace, out: Output, work: Path) -> list[dict[str, Any]]:
    samples: list[ClientSample] = []
    ctx = mp.get_context("spawn")
    with triton_sidecar(work) as (sidecar, triton_answer), running([]) as launched:
        answer_file = work / "answer.json"
        answer_file.write_bytes(triton_answer)
        trivial, trivial_port = start_server(launched, work, "trivial", 0, answer_file)
        ports = {"triton": sidecar.http_port, "trivial": trivial_port}
        pids = {"triton": sidecar.pid, "trivial": trivial.proc.pid}
        workers: dict[str, tuple[Any, Connection]] = {}
        try:
            for name in args.clients:
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=client_worker, args=(name, theirs), daemon=True)
                proc.start()
                workers[name] = (proc, mine)
            say("warming up every client")
            for _, pipe in workers.values():
                for target in args.targets:
                    pipe.send((ports[target], max(args.concurrency), 0.5, 0.0, triton_answer))
                    if "error" in (got := pipe.recv()):
                        raise RuntimeError(got["error"])
            total = args.rounds * len(args.targets) * len(args.concurrency) * len(args.clients)
            done = 0
            for rnd in range(args.rounds):
                for target in args.targets:
                    for conc in args.concurrency:
                        for name in rotated(args.clients, rnd):
                            pipe = workers[name][1]
                            server0 = tree_cpu(pids[target])
                            pipe.send((ports[target], conc, args.seconds, args.warmup_s, triton_answer))
                            got = pipe.recv()
                            if "error" in got:
                                raise RuntimeError(got["error"])
                            server_cpu = tree_cpu(pids[target]) - server0
                            s = ClientSample(
                                "sample",
                                rnd,
                                target,
                                name,
                                conc,
                                got["requests"],
                                got["req_per_s"],
                                got["p50_us"],
                                got["p99_us"],
                                got["errors"],
                                got["client_cpu_us_per_req"],
                                # The server also worked through the warm-up: counted over both.
                                server_cpu / (got["requests"] * (1 + args.warmup_s / args.seconds)) * 1e6,
                            )
                            samples.append(s)
                            out.record(asdict(s))
                            done += 1
                            say(
                                f"[{done}/{total}] round {rnd + 1} {target} c={conc} {name}: "
                                f"{s.req_per_s:,.0f}/s p50 {s.p50_us:.0f} µs p99 {s.p99_us:.0f} µs "
                                f"client cpu {s.client_cpu_us_per_req:.0f} µs/req"
                                + (f" ERRORS {s.errors}" if s.errors else "")
                            )
        finally:
            for proc, pipe in workers.values():
                with contextlib.suppress(OSError):
                    pipe.send(None)
                proc.join(10)
                if proc.is_alive():
                    proc.terminate()
                    proc.join()
    return summarise_clients(samples, args.clients)


# ---------------------------------------------------------------------------------------------
# Output.


def versions() -> dict[str, str]:
    """What was measured; sniffio matters: httpcore 1.0.9 tries to import it on every request."""
    from importlib import metadata

    found = {}
    for name in ("uvloop", "httptools", "aiohttp", "uvicorn", "h11", "httpx", "httpcore", "anyio", "sniffio"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def source_note() -> dict[str, Any]:
    """The commit measured, and the uncommitted files that can change these figures."""

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout

    status = git("status", "--porcelain").splitlines()
    changed = [line[3:] for line in status if line and not line.startswith("??")]
    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "uncommitted": [f for f in changed if f.startswith("functions/")],
    }


def _fmt(value: object, digits: int = 0) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "-" if value != value else f"{value:,.{digits}f}"
    return str(value)


def markdown(part: str, rows: list[dict[str, Any]], notes: list[dict[str, Any]]) -> str:
    start, end = notes[0], notes[-1]
    packages = ", ".join(f"{k} {v}" for k, v in start["versions"].items())
    lines = [
        f"Run on {start['date']} ({end['wall_s']:.0f} s; Python {start['python']}, {start['cpus']} CPUs; "
        f"load average {start['loadavg_1m']} at the start, {end['loadavg_1m']} at the end; commit "
        f"{start['commit']}"
        + (f", uncommitted changes in {', '.join(start['uncommitted'])}" if start["uncommitted"] else "")
        + f"). {packages}.",
        "",
    ]
    group_key, member_key, cpu_name = (
        ("workload", "stack", "server cpu µs/req")
        if part == "servers"
        else ("target", "client", "client cpu µs/req")
    )
    cpu_key = "server_cpu_us_per_req" if part == "servers" else "client_cpu_us_per_req"
    other_name, other_key = (
        ("Triton cpu µs/req", "triton_cpu_us_per_req")
        if part == "servers"
        else ("server cpu µs/req", "server_cpu_us_per_req")
    )
    base = SERVER_BASELINE if part == "servers" else CLIENT_BASELINE
    for group in dict.fromkeys(r[group_key] for r in rows):
        lines += [
            f"{group_key} `{group}`:",
            "",
            f"| conc | {member_key} | req/s | of {base} | p50 µs | p99 µs | {cpu_name} "
            f"| cpu of {base} | {other_name} | errors |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in rows:
            if r[group_key] == group:
                lines.append(
                    f"| {r['concurrency']} | {r[member_key]} | {_fmt(r['req_per_s'])} | "
                    f"{_fmt(r['ratio'], 2)} | {_fmt(r['p50_us'])} | {_fmt(r['p99_us'])} | "
                    f"{_fmt(r[cpu_key])} | {_fmt(r['cpu_ratio'], 2)} | {_fmt(r[other_key])} | {r['errors']} |"
                )
        lines.append("")
    return "\n".join(lines)


def table(part: str, rows: list[dict[str, Any]]) -> str:
    keys = (
        [
            "workload",
            "concurrency",
            "stack",
            "req_per_s",
            "ratio",
            "p50_us",
            "p99_us",
            "server_cpu_us_per_req",
        ]
        if part == "servers"
        else [
            "target",
            "concurrency",
            "client",
            "req_per_s",
            "ratio",
            "p50_us",
            "p99_us",
            "client_cpu_us_per_req",
        ]
    )
    keys += ["cpu_ratio", "errors"]
    return render_table(keys, [[r[k] for k in keys] for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{servers,clients}")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--rounds", type=int, default=5, help="rounds over every cell (default 5)")
        p.add_argument(
            "--seconds", type=int, default=2, help="measured seconds per cell and alternative (default 2)"
        )
        p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], help="default: 1 4 16")
        p.add_argument(
            "--markdown-out", type=Path, default=None, help="also write the summary as markdown tables"
        )
        add_output_options(p)

    servers = sub.add_parser("servers", help="the function's HTTP server against aiohttp and uvicorn (wrk)")
    common(servers)
    servers.add_argument("--stacks", nargs="+", default=list(SERVER_STACKS), choices=SERVER_STACKS)
    servers.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    clients = sub.add_parser("clients", help="the sidecar client against aiohttp and httpx")
    common(clients)
    clients.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    clients.add_argument("--targets", nargs="+", default=list(CLIENT_TARGETS), choices=CLIENT_TARGETS)
    clients.add_argument(
        "--warmup-s", type=float, default=0.3, help="unmeasured load before each measurement (default 0.3)"
    )
    serve = sub.add_parser("_serve")  # internal: one server process
    serve.add_argument("stack", choices=[*SERVER_STACKS, "trivial"])
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--upstream-port", type=int, default=0)
    serve.add_argument("--answer-file", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.command == "_serve":
        return serve_one(args.stack, args.port, args.upstream_port, args.answer_file)
    if SERVER_BASELINE not in getattr(args, "stacks", [SERVER_BASELINE]) or CLIENT_BASELINE not in getattr(
        args, "clients", [CLIENT_BASELINE]
    ):
        parser.error("the ratios need the spillway baseline in the run")

    out = Output(args.format, args.json_out)
    notes = [{**machine_note(), **source_note(), "versions": versions()}]
    out.record({"kind": "machine", "phase": "start", "part": args.command, **notes[0]})
    say(f"{args.command}: load average {notes[0]['loadavg_1m']} at the start")
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="spillway-http-stack-") as tmp:
            work = Path(tmp)
            rows = run_servers(args, out, work) if args.command == "servers" else run_clients(args, out, work)
        for row in rows:
            out.record(row)
        notes.append({**machine_note(), "wall_s": time.monotonic() - began})
        out.record({"kind": "machine", "phase": "end", **notes[-1]})
        say(f"done in {time.monotonic() - began:.0f} s; load average {notes[-1]['loadavg_1m']} at the end")
        if out.table:
            print(table(args.command, rows))
        if args.markdown_out is not None:
            args.markdown_out.write_text(markdown(args.command, rows, notes))
    finally:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
