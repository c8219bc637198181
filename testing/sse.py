"""Server-sent events read one at a time as they arrive (``generate_stream``), over any route."""

from __future__ import annotations

import http.client
import json
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit


class EventStream:
    """A POST whose answer is read event by event; each read waits at most ``timeout`` seconds,
    so a proxy that holds the stream back fails the test instead of hanging it."""

    def __init__(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str] | None = None,
        timeout: float = 20,
        chunked: bool = False,
    ):
        parts = urlsplit(url)
        self._conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        sent = {"content-type": "application/json", **(headers or {})}
        # Chunked: the body's size is framed by no Content-Length.
        self._conn.request("POST", target, iter([body]) if chunked else body, sent, encode_chunked=chunked)
        self.response = self._conn.getresponse()
        self.status = self.response.status
        self.headers = {k.lower(): v for k, v in self.response.getheaders()}

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Hang up, wherever the stream is: a client that leaves mid-generation."""
        self._conn.close()

    def next(self) -> dict[str, Any] | None:
        """The next event's data, parsed; None at the stream's end."""
        data: list[bytes] = []
        while True:
            line = self.response.readline()
            if not line:
                return json.loads(b"\n".join(data)) if data else None
            line = line.rstrip(b"\r\n")
            if not line and data:
                return json.loads(b"\n".join(data))  # type: ignore[no-any-return]
            if line.startswith(b"data:"):
                data.append(line[5:].strip())

    def rest(self) -> list[dict[str, Any]]:
        """Every event still to come, to the stream's end."""
        events = []
        while (event := self.next()) is not None:
            events.append(event)
        return events
