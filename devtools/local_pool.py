"""A local stand-in for a serverless platform's instance management, for tests, benchmarks and demos.

One HTTP front; behind it, function instances (real ``python -m functions serve --platform
aliyun-fc`` processes, each with its own Triton sidecar). Like Lambda and FC, it gives each
instance one request at a time, starts a new instance when none is free (a cold start, optionally
lengthened to stand for image pull and model load), and reaps instances idle longer than a TTL.
It is not a platform: no isolation, no billing, no autoscaling policy beyond "one at a time".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from functions.cli import serve_command
from functions.contract import WARMUP_PATH
from functions.http_types import HOP_BY_HOP, Request, Response, error_response
from functions.sidecar import free_port
from functions.sidecar_client import UpstreamPool, UpstreamUnavailable

log = logging.getLogger("spillway.local_pool")


@dataclass
class PoolSettings:
    model_repository: Path
    models: tuple[str, ...] = ()
    max_instances: int = 4
    idle_ttl_s: float = 60.0
    start_delay_s: float = 0.0
    request_timeout_s: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None


@dataclass
class _Instance:
    port: int
    proc: subprocess.Popen[bytes]
    pool: UpstreamPool
    started_at: float
    ready_at: float = 0.0
    last_used: float = 0.0
    busy: bool = False


@dataclass
class PoolStats:
    requests: int = 0
    cold_starts: int = 0
    rejected: int = 0
    instance_seconds: float = 0.0
    busy_seconds: float = 0.0
    warmup_busy_seconds: float = 0.0


class LocalFunctionPool:
    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self.stats = PoolStats()
        self._idle: deque[_Instance] = deque()
        self._all: list[_Instance] = []
        self._starting = 0
        self._waiters: deque[asyncio.Future[_Instance]] = deque()
        self._reaper: asyncio.Task[None] | None = None

    @property
    def live(self) -> int:
        return len(self._all)

    def addresses(self) -> list[str]:
        """host:port of each live instance (read from another thread: a copy of the list)."""
        return [f"127.0.0.1:{instance.port}" for instance in list(self._all)]

    def start(self) -> None:
        self._reaper = asyncio.ensure_future(self._reap())

    async def handle(self, request: Request) -> Response:
        """One request on one instance, as the platform would run it."""
        self.stats.requests += 1
        try:
            instance = await asyncio.wait_for(self._acquire(), self.settings.request_timeout_s)
        except TimeoutError:
            self.stats.rejected += 1
            return error_response(
                429, "no function instance became free in time; retry later", [("retry-after", "1")]
            )
        except RuntimeError as exc:
            self.stats.rejected += 1
            return error_response(502, f"a function instance failed to start: {exc}")
        started = time.monotonic()
        headers = [
            (k.encode(), v.encode("latin-1")) for k, v in request.headers.items() if k not in HOP_BY_HOP
        ]
        try:
            up = await instance.pool.request(
                request.method, request.target, headers, request.body, self.settings.request_timeout_s
            )
            response = Response(
                up.status,
                [
                    (k.decode(), v.decode("latin-1"))
                    for k, v in up.headers
                    if k not in (b"content-length", b"connection")
                ],
                up.body,
            )
        except (UpstreamUnavailable, TimeoutError) as exc:
            response = error_response(502, f"function instance failed: {exc!r}")
        finally:
            busy = time.monotonic() - started
            if request.path == WARMUP_PATH:
                self.stats.warmup_busy_seconds += busy
            else:
                self.stats.busy_seconds += busy
            self._release(instance)
        return response

    async def _acquire(self) -> _Instance:
        while self._idle:
            instance = self._idle.pop()
            if instance.proc.poll() is None:
                instance.busy = True
                return instance
            self._forget(instance)
        if len(self._all) + self._starting < self.settings.max_instances:
            self._starting += 1
            try:
                instance = await self._launch()
            finally:
                self._starting -= 1
            instance.busy = True
            self._all.append(instance)
            return instance
        waiter: asyncio.Future[_Instance] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return await waiter

    def _release(self, instance: _Instance) -> None:
        instance.last_used = time.monotonic()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(instance)
                return
        instance.busy = False
        self._idle.append(instance)

    async def _launch(self) -> _Instance:
        self.stats.cold_starts += 1
        port = free_port()
        env = {**os.environ, **self.settings.env, "PYTHONUNBUFFERED": "1"}
        if self.settings.models:
            env["SPILLWAY_MODELS"] = ",".join(self.settings.models)
        cmd = serve_command(port, self.settings.model_repository, "aliyun-fc")
        proc = await asyncio.to_thread(self._spawn, cmd, env, port)
        instance = _Instance(port, proc, UpstreamPool("127.0.0.1", port, max_idle=1), time.monotonic())
        await asyncio.sleep(self.settings.start_delay_s)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"instance on port {port} exited with {proc.returncode}")
            with contextlib.suppress(UpstreamUnavailable, TimeoutError, OSError):
                up = await instance.pool.request("POST", "/initialize", [], b"", 30)
                if up.status == 200:
                    instance.ready_at = time.monotonic()
                    return instance
                raise RuntimeError(f"instance on port {port} failed to initialize: {up.body[:300]!r}")
            await asyncio.sleep(0.05)
        proc.kill()
        raise RuntimeError(f"instance on port {port} did not start within 60 s")

    def _spawn(self, cmd: list[str], env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
        if self.settings.log_dir is None:
            return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        with (self.settings.log_dir / f"instance-{port}.log").open("wb") as sink:
            return subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.idle_ttl_s / 4))
            horizon = time.monotonic() - self.settings.idle_ttl_s
            for instance in [i for i in self._idle if i.last_used < horizon]:
                self._idle.remove(instance)
                log.info("reaping idle instance on port %d", instance.port)
                self._stop(instance)

    def _stop(self, instance: _Instance) -> None:
        self._forget(instance)
        instance.pool.close()
        if instance.proc.poll() is None:
            instance.proc.terminate()
            try:
                instance.proc.wait(10)
            except subprocess.TimeoutExpired:
                instance.proc.kill()
                instance.proc.wait()

    def _forget(self, instance: _Instance) -> None:
        if instance in self._all:
            self._all.remove(instance)
            self.stats.instance_seconds += time.monotonic() - instance.started_at

    def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for instance in list(self._all):
            self._stop(instance)
        self._idle.clear()


@contextlib.contextmanager
def running_pool(settings: PoolSettings, host: str = "127.0.0.1") -> Iterator[tuple[str, LocalFunctionPool]]:
    """A pool behind an HTTP front, on a loop thread of its own; yields its URL and the pool."""
    import threading

    from functions import http_server
    from functions.loop import new_event_loop

    pool = LocalFunctionPool(settings)
    loop = new_event_loop()
    ready = threading.Event()
    port = free_port()

    async def main() -> None:
        pool.start()
        await http_server.serve(pool.handle, host, port, 64 * 1024 * 1024)
        ready.set()

    def run() -> None:
        loop.run_until_complete(main())
        loop.run_forever()

    thread = threading.Thread(target=run, name="local-pool", daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the local pool did not start")
    try:
        yield f"http://{host}:{port}", pool
    finally:
        loop.call_soon_threadsafe(pool.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
