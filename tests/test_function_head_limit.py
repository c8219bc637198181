"""The function's limit on a request head, on the real server process (FC platform, real Triton):
request line and headers together at most ``SPILLWAY_MAX_HEADER_BYTES`` (65,536) bytes, however
the head is made up or sent; past it, one 431 and the connection closed."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from functions.signature import sign
from tests.support import Running, function_server, model_repository

pytestmark = pytest.mark.integration

KEY = "head-limit-test-signing-key-0123456789"
LIMIT = 65536
SHAPES = ("one header", "many headers", "request line", "small pieces", "after a request")


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp = tmp_path_factory.mktemp("head-limit")
    with function_server(model_repository(tmp, "add_sub"), tmp, SPILLWAY_SIGNING_KEY=KEY) as running:
        yield _port(running)


def _port(running: Running) -> int:
    return int(running.url.rsplit(":", 1)[1])


def _request(pad: int, shape: str, close: bool = True) -> bytes:
    """A signed ``GET /spillway/metrics`` (the function answers it itself: a query as long as the
    head allows would not reach Triton) padded by ``pad`` bytes where ``shape`` says."""
    target = "/spillway/metrics" + (f"?pad={'a' * pad}" if shape == "request line" else "")
    signature = sign(KEY.encode(), "GET", target, b"")
    lines = [f"GET {target} HTTP/1.1", "Host: x", f"X-Spillway-Signature: {signature}"]
    if close:
        lines.append("Connection: close")
    if shape == "many headers":
        lines += [f"X-Pad-{i:02d}: " + "a" * (pad // 90 + (i < pad % 90)) for i in range(90)]
    elif shape != "request line":
        lines.append("X-Pad: " + "a" * pad)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def head_of(size: int, shape: str) -> bytes:
    """Request line and headers of exactly ``size`` bytes, blank line included."""
    head = _request(size - len(_request(0, shape)), shape)
    assert len(head) == size
    return head


def statuses_until_closed(port: int, sent: list[bytes]) -> list[int]:
    """Every answer's status, in order, until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in sent:
            sock.sendall(piece)
        stream = sock.makefile("rb")
        statuses = []
        while line := stream.readline():
            statuses.append(int(line.split()[1]))
            length = 0
            while (header := stream.readline()) not in (b"\r\n", b""):
                name, _, value = header.partition(b":")
                length = int(value) if name.lower() == b"content-length" else length
            stream.read(length)
        return statuses


def _sent(size: int, shape: str) -> list[bytes]:
    if shape == "small pieces":
        head = head_of(size, "one header")
        return [head[i : i + 1000] for i in range(0, len(head), 1000)]
    if shape == "after a request":
        return [_request(0, "one header", close=False) + head_of(size, shape)]
    return [head_of(size, shape)]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_head_of_exactly_the_limit_is_served(port: int, shape: str) -> None:
    expected = [200, 200] if shape == "after a request" else [200]
    assert statuses_until_closed(port, _sent(LIMIT, shape)) == expected


@pytest.mark.parametrize("shape", SHAPES)
def test_one_byte_past_the_limit_gets_one_431_and_the_connection_closed(port: int, shape: str) -> None:
    expected = [200, 431] if shape == "after a request" else [431]
    assert statuses_until_closed(port, _sent(LIMIT + 1, shape)) == expected


def test_the_reported_70000_byte_head_gets_431(port: int) -> None:
    assert statuses_until_closed(port, [head_of(70_000, "one header")]) == [431]
