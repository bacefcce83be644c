"""HTTP/1.1 to one app instance over its unix socket (or to another replica over TCP), keeping idle
connections for the next request.

A general client (httpx) costs more CPU per request than the whole rest of the proxy path, and
the proxy's throughput is bounded by CPU: this one writes the request head itself, parses the
answer with httptools (uvicorn's C parser) and streams bodies both ways without copying them
into one buffer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httptools

READ_CHUNK = 1 << 16
MAX_IDLE = 32
HEAD_TIMEOUT = 300.0  # seconds an app may take before its answer starts


class UpstreamError(Exception):
    """The app closed the connection or sent something that is not HTTP."""


@dataclass
class _Answer:
    """httptools callbacks: the status line, headers and body pieces as they are parsed."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    headers_done: bool = False
    complete: bool = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class Response:
    """An answer whose body is read with `body()`; the connection goes back to the pool once read."""

    def __init__(self, upstream: Upstream, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 parser: httptools.HttpResponseParser, answer: _Answer, head_only: bool) -> None:
        self._upstream, self._parser, self._answer = upstream, parser, answer
        self._connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = connection  # None once given back
        self.status = parser.get_status_code()
        self.headers = answer.headers
        self._reusable = parser.should_keep_alive() and not head_only
        self._finished = head_only or answer.complete

    def whole_body(self) -> bytes | None:
        """The body, if all of it has arrived already (small answers come with their head), else None."""
        if not self._finished:
            return None
        body = b"".join(self._answer.chunks)
        self._answer.chunks.clear()
        self.close()
        return body

    async def body(self) -> AsyncIterator[bytes]:
        assert self._connection is not None, "the body was read already"
        reader = self._connection[0]
        try:
            while True:
                while self._answer.chunks:
                    yield self._answer.chunks.pop(0)
                if self._finished:
                    break
                data = await reader.read(READ_CHUNK)
                if not data:  # a body that ends with the connection
                    self._reusable = False
                    break
                try:
                    self._parser.feed_data(data)
                except httptools.HttpParserError as exc:
                    raise UpstreamError(f"the app sent a malformed body: {exc}") from None
                self._finished = self._answer.complete
        finally:
            self.close()

    def close(self) -> None:
        """Give the connection back (body read to its end) or close it."""
        if self._connection is None:
            return
        if self._finished and self._reusable:
            self._upstream._release(self._connection)
        else:
            self._connection[1].close()
        self._connection = None


class Upstream:
    def __init__(self, address: str, preamble: bytes = b"") -> None:
        """`address`: a unix socket's path, or "host:port"; `preamble`: sent first on each new connection (the token
        of a runner's relay in front of an app, sandbox.app_relay)."""
        self.address, self.preamble = address, preamble
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._closed = False

    async def request(self, method: str, target: str, headers: list[tuple[bytes, bytes]],
                      body: AsyncIterator[bytes] | None = None, chunked: bool = False) -> Response:
        """Send the request (the body streamed; chunk-encoded when `chunked`) and read the answer's head."""
        head = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1")]
        head += [name + b": " + value + b"\r\n" for name, value in headers]
        head.append(b"\r\n")
        reused, connection = self._connection()
        if connection is None:
            try:
                connection = await self._open()
            except OSError as exc:
                raise UpstreamError(f"cannot reach the app: {exc.strerror or exc}") from None
        reader, writer = connection
        try:
            writer.write(b"".join(head))
            if body is not None:
                async for chunk in body:
                    if chunk:
                        writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                        await writer.drain()
                if chunked:
                    writer.write(b"0\r\n\r\n")
            await writer.drain()
            answer = _Answer()
            parser = httptools.HttpResponseParser(answer)
            async with asyncio.timeout(HEAD_TIMEOUT):  # (not wait_for: that costs a task per read)
                while not answer.headers_done:
                    data = await reader.read(READ_CHUNK)
                    if not data:
                        raise UpstreamError("the app closed the connection without answering")
                    parser.feed_data(data)
        except (TimeoutError, OSError, UpstreamError, httptools.HttpParserError) as exc:
            writer.close()
            if reused and body is None:  # a kept connection the app had closed meanwhile: once more, fresh
                return await self.request(method, target, headers)
            raise UpstreamError(str(exc) or type(exc).__name__) from None
        except BaseException:
            writer.close()
            raise
        return Response(self, connection, parser, answer, head_only=method == "HEAD")

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.address.startswith("/"):
            reader, writer = await asyncio.open_unix_connection(self.address, limit=READ_CHUNK)
        else:
            host, _, port = self.address.rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port), limit=READ_CHUNK)
        if self.preamble:
            writer.write(self.preamble)
        return reader, writer

    def _connection(self) -> tuple[bool, tuple[asyncio.StreamReader, asyncio.StreamWriter] | None]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return True, (reader, writer)
            writer.close()
        return False, None

    def _release(self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE or connection[0].at_eof():
            connection[1].close()
        else:
            self._idle.append(connection)

    def close(self) -> None:
        self._closed = True
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()
