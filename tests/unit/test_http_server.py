"""The function's HTTP server: one answer to every request, and a bound on everything a client holds."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from functions import http_server
from functions.http_types import Request, Response
from functions.settings import HttpLimits

QUICK = HttpLimits(header_timeout_s=0.3, idle_timeout_s=0.3, body_timeout_s=0.3, max_connections=4)


async def _echo(request: Request) -> Response:
    if request.path == "/boom":
        raise RuntimeError("handler bug with a secret=hunter2 in it")
    return Response(200, [("content-type", "text/plain")], f"{request.method} {request.target}".encode())


@asynccontextmanager
async def _server(
    limits: HttpLimits = QUICK, handler: Callable[[Request], Awaitable[Response]] = _echo
) -> AsyncIterator[int]:
    server = await http_server.serve(handler, "127.0.0.1", 0, 1024, limits)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    body = await reader.readexactly(int(headers["content-length"]))
    return int(lines[0].split()[1]), headers, body


async def _answers_until_closed(reader: asyncio.StreamReader) -> list[int]:
    """Every status the server sends before it closes the connection (30 s at most: a hang fails)."""
    statuses = []
    while True:
        try:
            status, _, _ = await asyncio.wait_for(_read_answer(reader), 30)
        except asyncio.IncompleteReadError:
            return statuses
        statuses.append(status)


def _run(coro: Awaitable[object]) -> object:
    return asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


def test_a_failing_handler_answers_500_with_an_id_logs_the_traceback_and_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go() -> list[tuple[int, bytes]]:
        async with _server() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            answers = []
            for path in ("/boom", "/ok"):
                writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                status, _, body = await _read_answer(reader)
                answers.append((status, body))
            writer.close()
            return answers

    with caplog.at_level(logging.ERROR):
        (status, body), ok = _run(go())  # type: ignore[misc]
    assert status == 500
    message = json.loads(body)["error"]
    assert "hunter2" not in message and "RuntimeError" not in message
    error_id = message.split("(id ")[1].split(")")[0]
    logged = next(r for r in caplog.records if error_id in r.getMessage())
    assert logged.exc_info is not None and "hunter2" in str(logged.exc_info[1])
    assert ok == (200, b"GET /ok")


def test_a_header_over_the_limit_gets_431_and_the_connection_closes() -> None:
    async def go() -> list[int]:
        async with _server(HttpLimits(max_header_bytes=4096)) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
            for _ in range(64):
                writer.write(b"a" * 1024)
            await writer.drain()
            return await _answers_until_closed(reader)

    assert _run(go()) == [431]


def test_a_large_body_after_a_small_head_is_not_mistaken_for_a_large_head() -> None:
    async def go() -> tuple[int, dict[str, str], bytes]:
        server = await http_server.serve(_echo, "127.0.0.1", 0, 1 << 20, HttpLimits(max_header_bytes=1024))
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n" + b"z" * 65536)
        answer = await _read_answer(reader)
        server.close()
        return answer

    status, _, body = _run(go())  # type: ignore[misc]
    assert (status, body) == (200, b"POST /b")


def test_too_many_headers_get_431() -> None:
    async def go() -> list[int]:
        async with _server(HttpLimits(max_headers=10)) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            fields = "".join(f"X-{i}: v\r\n" for i in range(11))
            writer.write(f"GET / HTTP/1.1\r\n{fields}\r\n".encode())
            return await _answers_until_closed(reader)

    assert _run(go()) == [431]


def _head(size: int) -> bytes:
    """A GET whose request line and headers are exactly ``size`` bytes, blank line included."""
    head = b"GET /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: \r\n\r\n"
    return head.replace(b"X-Pad: ", b"X-Pad: " + b"a" * (size - len(head)))


BEFORE = {
    "nothing": b"",
    "empty lines": b"\r\n\r\n\r\n",
    "a request": b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
    "a body": b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\nbody\r\n\r\nbody",
    "a chunked body": (
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n"
    ),
}


@pytest.mark.parametrize("pieces", [1, 1000], ids=["one write", "byte by byte"])
@pytest.mark.parametrize("before", BEFORE)
@pytest.mark.parametrize(("size", "answer"), [(1024, 200), (1025, 431)], ids=["at the limit", "past it"])
def test_a_head_is_counted_from_its_first_byte_whatever_shares_its_reads(
    before: str, size: int, answer: int, pieces: int
) -> None:
    async def go() -> list[int]:
        async with _server(HttpLimits(max_header_bytes=1024)) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            sent = BEFORE[before] + _head(size)
            step = max(1, len(sent) // pieces)
            for start in range(0, len(sent), step):
                writer.write(sent[start : start + step])
                await writer.drain()
            return await _answers_until_closed(reader)

    earlier = [] if before in ("nothing", "empty lines") else [200]
    assert _run(go()) == [*earlier, answer]


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ", [408]),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789", [408]),
        (b"", []),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", [200]),
    ],
    ids=["slow headers", "stalled body", "never a byte", "idle keep-alive"],
)
def test_every_wait_on_a_client_has_a_timeout(sent: bytes, expected: list[int]) -> None:
    async def go() -> list[int]:
        async with _server() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(sent)
            return await _answers_until_closed(reader)

    assert _run(go()) == expected


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", [200]),
        ("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", [405]),
    ],
    ids=["upgrade", "connect"],
)
def test_upgrade_and_connect_get_exactly_one_answer(request_text: str, expected: list[int]) -> None:
    async def go() -> list[int]:
        async with _server() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request_text.encode() + b"\x00\x01garbage after the upgrade")
            return await _answers_until_closed(reader)

    assert _run(go()) == expected


def test_connections_past_the_limit_get_503_and_the_others_keep_working() -> None:
    async def go() -> tuple[list[int], int]:
        async with _server(HttpLimits(max_connections=2)) as port:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            for held_reader, held_writer in held:  # an answer on each: the server counts both
                held_writer.write(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await _read_answer(held_reader))[0] == 200
            reader, _ = await asyncio.open_connection("127.0.0.1", port)
            refused = await _answers_until_closed(reader)
            first_reader, first_writer = held[0]
            first_writer.write(b"GET /still HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, _ = await _read_answer(first_reader)
            return refused, status

    assert _run(go()) == ([503], 200)


def test_pipelined_requests_are_answered_in_order_and_reading_pauses_when_too_many_queue() -> None:
    gate = asyncio.Event()
    pad = "p" * 4000
    count = 2000  # 8 MB of requests: more than the socket buffers hold

    async def slow(request: Request) -> Response:
        await gate.wait()
        return Response(200, [], request.path.encode())

    async def go() -> tuple[bool, list[bytes]]:
        async with _server(HttpLimits(max_pipelined=4), slow) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = "GET /{} HTTP/1.1\r\nHost: x\r\nX-Pad: " + pad + "\r\n\r\n"
            writer.write(b"".join(head.format(i).encode() for i in range(count)))
            try:
                await asyncio.wait_for(writer.drain(), 1.0)
                server_kept_reading = True
            except TimeoutError:
                server_kept_reading = False
            gate.set()
            bodies = [(await _read_answer(reader))[2] for _ in range(count)]
            return server_kept_reading, bodies

    server_kept_reading, bodies = _run(go())  # type: ignore[misc]
    assert not server_kept_reading, "a blocked handler must stop the server reading more requests"
    assert bodies == [f"/{i}".encode() for i in range(count)]


async def _digest(request: Request) -> Response:
    """Answers with the size and SHA-256 of the body the handler got."""
    body = bytes(request.body)
    return Response(200, [("x-size", str(len(body)))], hashlib.sha256(body).hexdigest().encode())


def _post(body: bytes, path: str = "/up", extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


async def _big_server(limits: HttpLimits = QUICK) -> asyncio.Server:
    return await http_server.serve(_digest, "127.0.0.1", 0, 8 * 1024 * 1024, limits)


@pytest.mark.parametrize("split", [1, 7, 64 * 1024 - 3, 64 * 1024, 300_000])
def test_a_body_read_past_its_head_reaches_the_handler_whole_and_the_next_request_is_parsed(
    split: int,
) -> None:
    """The rest of a Content-Length body is read into the request's own buffers, never past its
    end: what follows in the same bytes is the next request, whatever the read boundaries."""
    first = bytes(range(256)) * 4096 + b"tail"
    second = b"second body"
    stream = _post(first) + _post(second, "/two") + b"GET /three HTTP/1.1\r\nHost: x\r\n\r\n"

    async def go() -> list[tuple[int, bytes]]:
        server = await _big_server(HttpLimits(body_timeout_s=5, header_timeout_s=5))
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for at in range(0, len(stream), split):
                writer.write(stream[at : at + split])
                await writer.drain()
            return [(s, b) for s, _, b in [await _read_answer(reader) for _ in range(3)]]
        finally:
            server.close()

    answers = _run(go())
    assert answers == [
        (200, hashlib.sha256(first).hexdigest().encode()),
        (200, hashlib.sha256(second).hexdigest().encode()),
        (200, hashlib.sha256(b"").hexdigest().encode()),
    ]


def test_a_body_that_stops_arriving_gets_408_even_when_read_past_the_parser() -> None:
    async def go() -> list[int]:
        server = await _big_server()
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(bytes(1_000_000))[:200_000])
            return await _answers_until_closed(reader)
        finally:
            server.close()

    assert _run(go()) == [408]


def test_chunked_and_smuggling_shaped_bodies_stay_with_the_parser() -> None:
    """Only a body framed by one Content-Length and nothing else is read outside the parser:
    Transfer-Encoding next to Content-Length, or two Content-Lengths, is refused as before."""
    chunk = bytes(100_000)
    chunked = (
        b"POST /c HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        + b"%x\r\n" % len(chunk)
        + chunk
        + b"\r\n0\r\n\r\n"
    )
    both = b"POST /s HTTP/1.1\r\nHost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
    twice = b"POST /t HTTP/1.1\r\nHost: x\r\ncontent-length: 5\r\ncontent-length: 50\r\n\r\nhello"

    async def go(stream: bytes) -> list[tuple[int, bytes]]:
        server = await _big_server()
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(stream)
            answers = []
            while True:
                try:
                    status, _, body = await asyncio.wait_for(_read_answer(reader), 30)
                except asyncio.IncompleteReadError:
                    return answers
                answers.append((status, body))
        finally:
            server.close()

    ok = _run(go(chunked + b"GET /x HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n"))
    assert ok == [
        (200, hashlib.sha256(chunk).hexdigest().encode()),
        (200, hashlib.sha256(b"").hexdigest().encode()),
    ]
    assert [s for s, _ in _run(go(both))] == [400]  # type: ignore[attr-defined]
    assert [s for s, _ in _run(go(twice))] == [400]  # type: ignore[attr-defined]


def test_a_body_larger_than_the_limit_is_refused_from_its_head_before_any_buffer_is_made() -> None:
    async def go() -> list[int]:
        server = await http_server.serve(_digest, "127.0.0.1", 0, 100_000, QUICK)
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\ncontent-length: 100001\r\n\r\n" + bytes(1000))
            return await _answers_until_closed(reader)
        finally:
            server.close()

    assert _run(go()) == [413]


def _chunked(trailer_bytes: int, path: str = "/c") -> bytes:
    """A chunked POST whose trailer section (after ``0\\r\\n``, final blank line included) is exactly
    ``trailer_bytes`` long (2: none)."""
    trailer = b"X-Trailer: \r\n\r\n" if trailer_bytes > 2 else b"\r\n"
    trailer = trailer.replace(b": ", b": " + b"t" * (trailer_bytes - len(trailer)))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-Head: h\r\n\r\n".encode()
    return head + b"4;ext=1\r\nbody\r\n3\r\n0\r\n\r\n00\r\n" + trailer


async def _header_names(request: Request) -> Response:
    return Response(200, [], ",".join(sorted(request.headers)).encode())


@pytest.mark.parametrize("pieces", [1, 1000], ids=["one write", "byte by byte"])
@pytest.mark.parametrize(
    ("size", "expected"), [(2, [200, 200]), (1024, [200, 200]), (1025, [431])], ids=["none", "at", "past"]
)
def test_a_trailer_section_is_bounded_as_a_head_is_and_the_next_request_follows_it(
    size: int, expected: list[int], pieces: int
) -> None:
    async def go() -> list[int]:
        async with _server(HttpLimits(max_header_bytes=1024)) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            sent = _chunked(size) + b"GET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            step = max(1, len(sent) // pieces)
            for start in range(0, len(sent), step):
                writer.write(sent[start : start + step])
                await writer.drain()
            return await _answers_until_closed(reader)

    assert _run(go()) == expected


def test_trailer_fields_are_dropped_not_taken_for_headers() -> None:
    async def go() -> tuple[int, dict[str, str], bytes]:
        async with _server(handler=_header_names) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_chunked(40))
            return await _read_answer(reader)

    status, _, names = _run(go())  # type: ignore[misc]
    assert (status, names) == (200, b"host,transfer-encoding,x-head")
