"""HTTP/1.1 on the wire for :class:`~kernel.status.http.StatusServer`: one request parsed, one answer written.

The server answers ``GET`` without a body, and the state-changing methods (``POST``,
``PUT``, ``DELETE``) of a management API with a ``Content-Length`` body of at most
1 MiB; so the parser is the few lines of RFC 9112 that takes: a request line, header
lines up to the empty line, the body by its length, the connection's persistence
(HTTP/1.1: kept unless ``Connection: close``; HTTP/1.0: closed unless ``keep-alive``).
A ``GET`` with a body, a ``Transfer-Encoding``, a malformed line, a head over 64 KiB or
a body over 1 MiB gets ``400``/``413`` and the connection is closed. h11, a complete
HTTP/1.1 state machine, was tried first: it took ~350 us per request on the shared
2-core machine at load ~15 (this parser and the answer together ~190 us there), and at
1,000 interactive queries/s that alone was a third of a core.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernel.status.http import StatusServer

MAX_HEAD_BYTES = 64 * 1024
"""A request's line and headers; a larger head gets ``413``."""
MAX_BODY_BYTES = 1024 * 1024
"""A state-changing request's body (a pipeline YAML); a larger one gets ``413``."""
BODY_METHODS = frozenset({b"POST", b"PUT", b"DELETE", b"PATCH"})
# the headers a route may read; others are skipped while parsing
_KEPT = frozenset(
    {
        b"authorization",
        b"connection",
        b"host",
        b"origin",
        b"content-type",
        b"sec-fetch-site",
        b"content-length",
        b"transfer-encoding",
    }
)


@dataclass
class Request:
    """One parsed request.

    Attributes:
        method: ``GET``, ``POST``, ...
        target: the request target (path and query).
        headers: the kept headers (lower-case names: ``authorization``, ``host``, ``origin``,
            ``content-type``, ``sec-fetch-site``), latin-1 text.
        body: the body (empty for ``GET``).
    """

    method: str
    target: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def path(self) -> str:
        """The target without its query."""
        return self.target.split("?", 1)[0]


class Response:
    """One answer: status, content type, body, extra headers."""

    __slots__ = ("code", "ctype", "body", "extra")

    def __init__(self, code: int, ctype: str, body: bytes, extra: tuple[tuple[bytes, bytes], ...] = ()):
        self.code, self.ctype, self.body, self.extra = code, ctype, body, extra


REASONS = {
    200: b"OK",
    202: b"Accepted",
    204: b"No Content",
    303: b"See Other",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    409: b"Conflict",
    413: b"Content Too Large",
    415: b"Unsupported Media Type",
    422: b"Unprocessable Content",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


class Connection(asyncio.Protocol):
    """One client connection: requests parsed as they arrive, answered in order (HTTP/1.1 keep-alive, pipelining)."""

    def __init__(self, server: StatusServer):
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False  # an answer is being computed off the loop: parse nothing more until it is written
        self.keep = True  # keep the connection after the current answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """A client connected (asyncio): keep its transport."""
        self.transport = transport  # type: ignore[assignment]
        self.server._clients.add(self.transport)  # type: ignore[arg-type]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # small answers: no Nagle delay waiting for the client's delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        """Bytes arrived (asyncio): answer every request they complete."""
        self.buffer += data
        if self.busy and len(self.buffer) > 16 * MAX_HEAD_BYTES + MAX_BODY_BYTES and self.transport is not None:
            self.transport.pause_reading()  # pipelined requests behind a slow answer: backpressure, not memory
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        """The client went (asyncio)."""
        if self.transport is not None:
            self.server._clients.discard(self.transport)
        self.transport = None

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0 or end > MAX_HEAD_BYTES:  # a head over the limit, whether it came in one read or many
                if end > MAX_HEAD_BYTES or len(self.buffer) > MAX_HEAD_BYTES:
                    self._fail(413)
                return
            parsed = self._parse(self.buffer[:end])
            if parsed is None:
                return
            request, length = parsed
            if len(self.buffer) < end + 4 + length:
                return  # the body is still coming
            request.body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            self._request(request)
            if not self.keep:
                return

    def _parse(self, head: bytes) -> tuple[Request, int] | None:
        """The request of ``head`` and its body's length; ``None`` when it was refused (answered, closing)."""
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._fail(400)
            return None
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                self._fail(400)
                return None
            name = name.strip().lower()
            if name in _KEPT:
                headers[name.decode()] = value.strip().decode("latin-1")
        length_text = headers.pop("content-length", "0")
        if "transfer-encoding" in headers or not length_text.isdigit():
            self._fail(400)  # never read: the stream's framing is unknown from here on
            return None
        length = int(length_text)
        if length and method not in BODY_METHODS:
            self._fail(400)
            return None
        if length > MAX_BODY_BYTES:
            self._fail(413)
            return None
        connection = headers.get("connection", "").lower()
        self.keep = "close" not in connection if version == b"HTTP/1.1" else "keep-alive" in connection
        return Request(method.decode("latin-1"), target.decode("latin-1"), headers), length

    def _request(self, request: Request) -> None:
        answer = self.server._answer_now(request)
        if answer is not None:
            self._write(answer)
            return
        self.busy = True  # answered on the pool: later requests of this connection wait their turn
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.server._pool, self.server._answer_slow, request)
        future.add_done_callback(self._written_later)

    def _written_later(self, future: asyncio.Future[Response]) -> None:
        self.busy = False
        self._write(future.result())
        self._next()
        if self.transport is not None and not self.transport.is_reading():
            self.transport.resume_reading()

    def _write(self, answer: Response) -> None:
        if self.transport is None:
            return
        head = [
            b"HTTP/1.1 %d %s" % (answer.code, REASONS.get(answer.code, b"")),
            b"Content-Type: " + answer.ctype.encode(),
            b"Content-Length: %d" % len(answer.body),
            b"Cache-Control: no-store",
        ]
        head += [name + b": " + value for name, value in answer.extra]
        if not self.keep:
            head.append(b"Connection: close")
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + answer.body)
        if not self.keep:
            self.transport.close()

    def _fail(self, status: int) -> None:
        self.keep = False
        self._write(Response(status, "text/plain", f"bad request ({status})\n".encode()))
