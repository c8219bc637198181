"""The function's HTTP server owes every request one answer, even when its handler fails."""

from __future__ import annotations

import asyncio
import json

from functions import http_server
from functions.messages import Request, Response


def test_a_failing_handler_still_answers_500_and_the_connection_keeps_serving() -> None:
    async def handler(request: Request) -> Response:
        if request.path == "/boom":
            raise RuntimeError("handler bug")
        return Response(200, [("content-type", "text/plain")], b"fine")

    async def go() -> list[tuple[bytes, bytes]]:
        server = await http_server.serve(handler, "127.0.0.1", 0, 1024)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        for path in ("/boom", "/ok"):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            answers.append((head.split(b"\r\n")[0], await reader.readexactly(length)))
        writer.close()
        server.close()
        return answers

    (boom_status, boom_body), ok = asyncio.run(asyncio.wait_for(go(), 10))
    assert boom_status.startswith(b"HTTP/1.1 500 ") and "handler bug" in json.loads(boom_body)["error"]
    assert ok == (b"HTTP/1.1 200 OK", b"fine")
