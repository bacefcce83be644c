"""A runner node's TCP door to one hosted app: each connection that opens with the app's token is joined,
bytes as they are, to the app's unix socket.

The IDE replicas' proxies reach apps hosted on runner nodes through it. The token (random, per app, told
to the replicas through Redis) keeps everyone else out: the port is open on the runner's network, and a
browser led to it directly would otherwise talk to the app without the proxy's header policy (and send the
IDE's cookies to it, since cookies ignore ports). One asyncio Protocol per side and no task per connection,
as in the apps' edge; each side pauses the other when its buffer fills.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from typing import cast

log = logging.getLogger(__name__)
TOKEN_BYTES = 32


class PipeTo(asyncio.Protocol):
    """The far end of a connection forwarded whole: what it receives goes, as it is, to `visitor` (the app's side of
    a relay here; a visitor's connection tunnelled to another replica in the apps' edge)."""

    def __init__(self, visitor: asyncio.Transport) -> None:
        self.visitor = visitor

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.visitor.write(data)

    def pause_writing(self) -> None:
        self.visitor.pause_reading()

    def resume_writing(self) -> None:
        self.visitor.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.visitor.close()


class _VisitorSide(asyncio.Protocol):
    """A connection to the relay's port: the token first, then bytes for the app."""

    def __init__(self, relay: AppRelay) -> None:
        self.relay = relay
        self.early = b""  # what came before the app's side was connected (the token first)
        self.app: PipeTo | None = None
        self.checked = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.app is not None:
            self.app.transport.write(data)
            return
        self.early += data
        if self.checked or len(self.early) < TOKEN_BYTES:
            return
        if not hmac.compare_digest(self.early[:TOKEN_BYTES], self.relay.token):
            self.transport.close()
            return
        self.checked, self.early = True, self.early[TOKEN_BYTES:]
        self.transport.pause_reading()
        task = asyncio.get_running_loop().create_task(asyncio.get_running_loop().create_unix_connection(
            lambda: PipeTo(self.transport), self.relay.socket_path))
        task.add_done_callback(self._connected)

    def _connected(self, done: asyncio.Task[tuple[asyncio.Transport, PipeTo]]) -> None:
        if done.cancelled() or done.exception() is not None or self.transport.is_closing():
            if not done.cancelled() and done.exception() is None:
                done.result()[0].close()
            else:
                log.info("app socket %s: %s", self.relay.socket_path, done.exception())
            self.transport.close()
            return
        self.app = done.result()[1]
        if self.early:
            self.app.transport.write(self.early)
            self.early = b""
        self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        if self.app is not None and self.app.transport.can_write_eof():
            self.app.transport.write_eof()
            return True  # half-closed: the answer may still come
        return None

    def pause_writing(self) -> None:
        if self.app is not None:
            self.app.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.app is not None:
            self.app.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.app is not None:
            self.app.transport.close()


class AppRelay:
    """Listens on `host` (any free port) for one app's socket; `address` and `token` are what clients need."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.address = ""
        self._server: asyncio.Server | None = None

    async def start(self, host: str) -> None:
        self._server = await asyncio.get_running_loop().create_server(lambda: _VisitorSide(self), host, 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"{host}:{port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
