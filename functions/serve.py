"""The long-running function server for FC custom containers and for local development."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from functions.instance import Instance
from functions.settings import FunctionSettings
from functions.sidecar import Sidecar

log = logging.getLogger("spillway.function")

PLATFORMS = ("aliyun-fc", "local")


def run(platform: str, host: str, port: int, model_repository: Path | None) -> int:
    """Start the sidecar first, then import and serve; returns the process exit code."""
    instance = Instance()
    settings = FunctionSettings.from_env(model_repository=str(model_repository) if model_repository else None)
    sidecar = Sidecar(settings.sidecar_options())
    sidecar.start()

    from functions.loop import new_event_loop

    loop = new_event_loop()
    try:
        return loop.run_until_complete(_serve(platform, host, port, settings, sidecar, instance))
    finally:
        sidecar.stop()
        loop.close()


async def _serve(
    platform: str, host: str, port: int, settings: FunctionSettings, sidecar: Sidecar, instance: Instance
) -> int:
    import asyncio

    from functions import http_server
    from functions.aliyun_fc import FcRoutes
    from functions.core import FunctionCore
    from functions.model_probe import preload
    from functions.sidecar import SidecarFailed

    core = FunctionCore.on_sidecar(settings, sidecar, instance)
    handler = FcRoutes(core) if platform == "aliyun-fc" else core.handle
    server = await http_server.serve(handler, host, port, settings.max_body_bytes, settings.http)
    log.info(
        "serving %s on %s:%d (instance %s, models %s)",
        platform,
        host,
        port,
        instance.id,
        ",".join(settings.models) or "-",
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    preload()
    code = 0
    try:
        await loop.run_in_executor(None, sidecar.wait_ready, settings.ready_timeout_s + 1)
        log.info("sidecar ready after %.0f ms", core.init_ms)
        await stop.wait()
        log.info("stopping")
    except SidecarFailed as exc:
        log.error("%s", exc)
        await asyncio.sleep(0.5)
        code = 1
    server.close()
    await server.wait_closed()
    await core.close()
    return code
