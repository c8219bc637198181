"""The runner's Unix socket: where APISIX finds it, and who may connect."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
from pathlib import Path

from gateway_plugin.runner.connection import ApisixConnection
from gateway_plugin.runner.dispatch import Runner

BACKLOG = 1024


def socket_path(address: str | None = None) -> Path:
    """The socket APISIX names in ``APISIX_LISTEN_ADDRESS`` (``unix:/path``)."""
    raw = address if address is not None else os.environ.get("APISIX_LISTEN_ADDRESS", "")
    if not raw:
        raise ValueError(
            "APISIX_LISTEN_ADDRESS is not set: APISIX sets it when it starts the runner "
            "(ext-plugin.cmd); set it yourself, e.g. unix:/tmp/runner.sock, to run by hand"
        )
    return Path(raw.removeprefix("unix:"))


async def serve(
    runner: Runner, path: Path, group: str | None = None, sock: socket.socket | None = None
) -> asyncio.AbstractServer:
    """Listen on ``path``, owner-only (0600), or owner and ``group`` (0660) where APISIX's workers
    run as another user: only APISIX may talk to the runner. ``sock``: a socket already bound and
    listening there (a worker's, inherited from its parent), accepted on as it is."""
    loop = asyncio.get_running_loop()
    if sock is not None:
        return await loop.create_unix_server(lambda: ApisixConnection(runner), sock=sock, backlog=BACKLOG)
    if path.is_socket():
        path.unlink()
    server = await loop.create_unix_server(lambda: ApisixConnection(runner), str(path), backlog=BACKLOG)
    _restrict(path, group)
    return server


def bind(path: Path, group: str | None = None) -> socket.socket:
    """The listening socket the parent of several workers binds once; each worker accepts on it."""
    if path.is_socket():
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    _restrict(path, group)
    sock.listen(BACKLOG)
    return sock


def _restrict(path: Path, group: str | None) -> None:
    if group is None:
        os.chmod(path, 0o600)
    else:
        shutil.chown(path, group=group)
        os.chmod(path, 0o660)


def socket_identity(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_dev, info.st_ino


def unlink_if_ours(path: Path, identity: tuple[int, int]) -> None:
    """On ``apisix reload`` a successor runner listens on the same path: never remove its socket."""
    with contextlib.suppress(FileNotFoundError):
        if socket_identity(path) == identity:
            path.unlink()
