"""The function's limit on a request head, on the real server process (FC platform, real Triton):
request line and headers together at most ``SPILLWAY_MAX_HEADER_BYTES`` (65,536) bytes, however
the head is made up or sent, and so is the trailer section after a chunked body; past it, one 431
and the connection closed."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from functions.signature import sign
from testing.function import Running, function_server, model_repository

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
        return statuses_read(sock)


def statuses_read(sock: socket.socket) -> list[int]:
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


WARMUP = b'{"spillway_warmup": {"dwell_ms": 0}}'


def _chunked_warmup(trailer_bytes: int) -> tuple[bytes, bytes]:
    """A signed, chunked ``POST /spillway/warmup`` up to its last chunk's size line, and a trailer
    section of exactly ``trailer_bytes`` bytes (its final blank line included)."""
    signature = sign(KEY.encode(), "POST", "/spillway/warmup", WARMUP)
    head = (
        "POST /spillway/warmup HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Transfer-Encoding: chunked\r\nX-Spillway-Signature: {signature}\r\n\r\n"
    ).encode()
    body = b"%x\r\n%s\r\n0\r\n" % (len(WARMUP), WARMUP)
    trailer = b"X-Pad: \r\n\r\n"
    return head + body, trailer.replace(b": ", b": " + b"a" * (trailer_bytes - len(trailer)))


@pytest.mark.parametrize(("size", "expected"), [(LIMIT, [200]), (LIMIT + 1, [431])])
def test_a_trailer_section_counts_as_a_head_does(port: int, size: int, expected: list[int]) -> None:
    request, trailer = _chunked_warmup(size)
    assert len(trailer) == size
    assert statuses_until_closed(port, [request + trailer]) == expected


def _peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


def test_a_200_mib_trailer_gets_one_431_and_the_server_holds_none_of_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The reported attack: a trailer field that never ends, streamed as fast as loopback goes."""
    tmp = tmp_path_factory.mktemp("trailer")
    with function_server(model_repository(tmp, "add_sub"), tmp, SPILLWAY_SIGNING_KEY=KEY) as running:
        before = _peak_rss_kib(running.proc.pid)
        request, _ = _chunked_warmup(0)
        with socket.create_connection(("127.0.0.1", _port(running)), timeout=60) as sock:

            def stream() -> None:
                piece = b"a" * (1 << 20)
                try:
                    sock.sendall(request + b"X-Pad: ")
                    for _ in range(200):
                        sock.sendall(piece)
                except OSError:
                    return  # the server closed the connection: the rest is not wanted

            sender = threading.Thread(target=stream)
            sender.start()
            statuses = statuses_read(sock)
            sender.join()
        grown_kib = _peak_rss_kib(running.proc.pid) - before
    assert statuses == [431]
    assert grown_kib < 32 * 1024, f"the server grew by {grown_kib} KiB while refusing the trailer"
