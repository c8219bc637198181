"""The runner's Unix socket: where APISIX finds it, and who may connect."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from gateway_plugin.runner.connection import ApisixConnection
from gateway_plugin.runner.dispatch import Runner


def socket_path(address: str | None = None) -> Path:
    """The socket APISIX names in ``APISIX_LISTEN_ADDRESS`` (``unix:/path``)."""
    raw = address if address is not None else os.environ.get("APISIX_LISTEN_ADDRESS", "")
    if not raw:
        raise ValueError(
            "APISIX_LISTEN_ADDRESS is not set: APISIX sets it when it starts the runner "
            "(ext-plugin.cmd); set it yourself, e.g. unix:/tmp/runner.sock, to run by hand"
        )
    return Path(raw.removeprefix("unix:"))


async def serve(runner: Runner, path: Path, group: str | None = None) -> asyncio.AbstractServer:
    """Listen on ``path``, owner-only (0600), or owner and ``group`` (0660) where APISIX's workers
    run as another user: only APISIX may talk to the runner."""
    if path.is_socket():
        path.unlink()
    server = await asyncio.get_running_loop().create_unix_server(
        lambda: ApisixConnection(runner), str(path), backlog=1024
    )
    if group is None:
        os.chmod(path, 0o600)
    else:
        shutil.chown(path, group=group)
        os.chmod(path, 0o660)
    return server


def socket_identity(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_dev, info.st_ino


def unlink_if_ours(path: Path, identity: tuple[int, int]) -> None:
    """On ``apisix reload`` a successor runner listens on the same path: never remove its socket."""
    with contextlib.suppress(FileNotFoundError):
        if socket_identity(path) == identity:
            path.unlink()
