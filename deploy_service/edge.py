"""The apps' own listener (`CODEYARD_APPS_PORT`): HTTP/1.1 from the client's socket straight to an instance.

Why a second door besides the IDE port's ASGI gateway: there, each request pays for uvicorn's
ASGI cycle (a task, the scope, the send/receive messages) and a stream-based client, and that hop
cost more CPU than a small app's whole answer. Here one asyncio Protocol per client connection
parses the head with httptools, writes the rewritten head on a kept-alive connection to the
instance's unix socket and passes the body through as it arrives, with no task per request.
After an app answers an Upgrade (WebSocket) with 101, both sockets become one byte tunnel.

Routing, the header rules and the in-flight count that a switch drains are the gateway's
(deploy_service.proxy), so both doors behave alike. The listener is also its own origin, apart
from the IDE's; by host name (`{slug}.apps.<host>`) each app gets an origin of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from typing import cast

import httptools

from deploy_service.instance import AppInstance
from deploy_service.proxy import (
    APP_PATH,
    NO_APP,
    app_host_pattern,
    app_request_headers,
    app_response_headers,
    forwarded_headers,
    unavailable,
)
from deploy_service.service import DeployService
from sandbox import PipeTo

log = logging.getLogger(__name__)

HEAD_TIMEOUT = 300.0  # seconds an app may take before its answer starts
IDLE_TIMEOUT = 75.0  # a client's kept-alive connection with nothing asked
HEAD_READ_TIMEOUT = 30.0  # a request head must arrive whole within this (no slow-header hold-ups)
MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE_PER_INSTANCE = 32
REASONS = {400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed", 431: b"Request Header Fields Too Large",
           502: b"Bad Gateway",
           503: b"Service Unavailable", 504: b"Gateway Timeout", 308: b"Permanent Redirect"}


def _plain_response(status: int, text: str, extra: Sequence[tuple[bytes, bytes]] = (), close: bool = False) -> bytes:
    body = text.encode()
    head = [b"HTTP/1.1 %d %s" % (status, REASONS.get(status, b"")),
            b"content-type: text/plain; charset=utf-8", b"content-length: %d" % len(body)]
    head += [name + b": " + value for name, value in extra]
    if close:
        head.append(b"connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class _HeadTooLarge(Exception):
    pass


class _Exchange:
    """One request from its head to the end of its answer."""

    __slots__ = ("url", "headers", "host", "head_bytes", "method", "keep_alive", "upgrade", "http10", "local", "instance", "own_host",
                 "target", "prefix", "chunked", "body", "body_done", "upstream", "answered", "finished")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.host = b""
        self.head_bytes = 0
        self.method = b"GET"
        self.keep_alive = self.upgrade = self.http10 = self.own_host = self.chunked = False
        self.local: bytes | None = None  # an answer of our own (404, 503, redirect)
        self.instance: AppInstance | None = None
        self.target = self.prefix = ""
        self.body: list[bytes] = []  # arrived before an upstream connection was ready
        self.body_done = self.answered = self.finished = False
        self.upstream: UpstreamConnection | None = None


class AppsEdge:
    """The listening socket, its client connections and the idle connections to each instance."""

    def __init__(self, deploys: DeployService) -> None:
        self.deploys = deploys
        self.clients: set[ClientConnection] = set()
        self._idle: dict[str, list[UpstreamConnection]] = {}
        self._servers: list[asyncio.Server] = []
        self.port = 0  # where the other replicas reach this one's apps

    async def start(self, host: str, port: int, shared: bool = False) -> None:
        """Serve the apps port. `shared` (`serve --workers`): every worker accepts on it (SO_REUSEPORT) and
        also on a port of its own, the one advertised, where the others tunnel to the apps' owner."""
        loop = asyncio.get_running_loop()
        for bound in ((port, 0) if shared else (port,)):
            self._servers.append(await loop.create_server(lambda: ClientConnection(self), host, bound,
                                                          reuse_address=True, reuse_port=shared or None))
        self.port = self._servers[-1].sockets[0].getsockname()[1]

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for client in list(self.clients):
            client.transport.close()
        for idle in self._idle.values():
            for connection in idle:
                connection.transport.close()
        self._idle.clear()
        for server in self._servers:
            await server.wait_closed()

    def route(self, exchange: _Exchange) -> None:
        """Find the instance for the request, or set the answer we give ourselves."""
        if exchange.method == b"CONNECT":
            exchange.local = _plain_response(405, "This server is no forward proxy.")
            return
        path, _, query = exchange.url.partition(b"?")
        apps_host = self.deploys.apps_host
        if apps_host and (match := app_host_pattern(apps_host).match(exchange.host.decode("latin-1").lower())):
            slug, rest, exchange.own_host = match.group(1), path.decode("latin-1"), True
        elif path_match := APP_PATH.match(path):
            if path_match.group(2) is None:  # /apps/{slug}: relative links need the trailing slash
                exchange.local = _plain_response(308, "", [(b"location", path + b"/" + (b"?" + query if query else b""))])
                return
            slug, rest = path_match.group(1).decode(), path_match.group(2).decode("latin-1")
            exchange.prefix = f"/apps/{slug}"
        else:
            exchange.local = _plain_response(404, NO_APP)
            return
        if not rest.startswith("/"):
            exchange.local = _plain_response(400, "The request target must be a path.")
            return
        route = self.deploys.routes.get(slug)
        instance = route.pick() if route else None
        if instance is None:
            exchange.local = _plain_response(*unavailable(route))
            return
        exchange.instance = instance
        exchange.target = rest + ("?" + query.decode("latin-1") if query else "")

    def connect(self, exchange: _Exchange, instance: AppInstance, client: ClientConnection) -> None:
        """Send the exchange on an idle connection to its instance, or on a new one."""
        path, preamble = instance.address, instance.preamble
        idle = self._idle.get(path)
        while idle:
            connection = idle.pop()
            if not connection.transport.is_closing():
                connection.send(exchange, client)
                return
        loop = asyncio.get_running_loop()
        if path.startswith("/"):
            opening = loop.create_unix_connection(lambda: UpstreamConnection(self, path, preamble), path)
        else:  # the relay in front of it on its runner node
            host, _, port = path.rpartition(":")
            opening = loop.create_connection(lambda: UpstreamConnection(self, path, preamble), host, int(port))
        task = loop.create_task(opening)
        task.add_done_callback(lambda done: self._connected(done, path, exchange, client))

    def _connected(self, task: asyncio.Task[tuple[asyncio.Transport, UpstreamConnection]], path: str,
                   exchange: _Exchange, client: ClientConnection) -> None:
        if exchange.finished:  # the client left meanwhile
            if not task.cancelled() and task.exception() is None:
                task.result()[0].close()
            return
        if task.cancelled() or task.exception() is not None:
            log.info("app at %s: cannot connect: %s", path, task.exception())
            client.fail(exchange, 502, "The app did not answer.")
            return
        task.result()[1].send(exchange, client)

    def tunnel_to_owner(self, client: ClientConnection) -> None:
        """This replica does not run the apps: the visitor's connection goes on, bytes as they are, to the one
        that does (deploy_service.owner)."""
        owner = self.deploys.ownership.owner
        if owner is None or owner.apps is None:
            client.transport.write(_plain_response(503, "The apps are moving to another server; try again in a few "
                                                        "seconds.", [(b"retry-after", b"5")], close=True))
            client.transport.close()
            return
        host, _, port = owner.apps.rpartition(":")
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.create_connection(lambda: PipeTo(client.transport), host, int(port)))

        def connected(done: asyncio.Task[tuple[asyncio.Transport, PipeTo]]) -> None:
            if done.cancelled() or done.exception() is not None or client.transport.is_closing():
                if not done.cancelled() and done.exception() is None:
                    done.result()[0].close()
                client.transport.close()
                return
            client.open_tunnel(done.result()[0])

        task.add_done_callback(connected)

    def keep(self, connection: UpstreamConnection) -> None:
        idle = self._idle.setdefault(connection.path, [])
        if len(idle) < MAX_IDLE_PER_INSTANCE and not connection.transport.is_closing():
            idle.append(connection)
        else:
            connection.transport.close()

    def forget(self, connection: UpstreamConnection) -> None:
        idle = self._idle.get(connection.path)
        if idle is not None and connection in idle:
            idle.remove(connection)
            if not idle:
                del self._idle[connection.path]


class ClientConnection(asyncio.Protocol):
    """A visitor's connection: requests are parsed as they come and answered in order."""

    def __init__(self, edge: AppsEdge) -> None:
        self.edge = edge
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[_Exchange] = deque()  # the first is being answered; the rest were pipelined behind it
        self.parsing = _Exchange()  # the request whose head or body is arriving (a blank one before the first)
        self.tunnel: asyncio.Transport | None = None  # after a 101: bytes go straight to the app
        self.early = b""  # bytes after an upgrade request's head, before the app said 101
        self.upgrading = False
        self.client_ip = ""
        self._idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's
        self.edge.clients.add(self)
        peer = transport.get_extra_info("peername")
        self.client_ip = peer[0] if peer else ""
        self._idle_timer = asyncio.get_running_loop().call_later(IDLE_TIMEOUT, transport.close)
        if not self.edge.deploys.ownership.is_owner:
            self.upgrading = True  # keep what comes until the tunnel to the replica running the apps is up
            self.edge.tunnel_to_owner(self)

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel.write(data)
            return
        if self.upgrading:
            self.early += data
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self.upgrading = True
            self.early = data[upgrade.args[0]:]
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadTooLarge) and not self.queue:
                self.transport.write(_plain_response(431, "The request head is too large.", close=True))
            self.transport.close()
        except httptools.HttpParserError:
            if not self.queue:  # garbage between requests; mid-answer we just stop reading
                self.transport.write(_plain_response(400, "Malformed HTTP request.", close=True))
            self.transport.close()

    # ----- httptools callbacks -----

    def on_message_begin(self) -> None:
        self.parsing = _Exchange()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = asyncio.get_running_loop().call_later(HEAD_READ_TIMEOUT, self.transport.close)

    def on_url(self, url: bytes) -> None:
        self.parsing.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self.parsing.headers.append((name, value))
        if name == b"host":
            self.parsing.host = value
        self._count(len(name) + len(value))

    def _count(self, size: int) -> None:
        self.parsing.head_bytes += size
        if self.parsing.head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge()

    def on_headers_complete(self) -> None:
        if self._idle_timer is not None:  # (on_message_begin set it)
            self._idle_timer.cancel()
        self._idle_timer = None
        exchange = self.parsing
        exchange.method = self.parser.get_method()
        exchange.keep_alive = self.parser.should_keep_alive()
        exchange.upgrade = self.parser.should_upgrade()
        exchange.http10 = self.parser.get_http_version() == "1.0"
        names = {name for name, _ in exchange.headers}
        exchange.chunked = b"transfer-encoding" in names  # httptools only lets a chunked one through
        self.edge.route(exchange)
        if exchange.local is None and (b"expect", b"100-continue") in exchange.headers and not self.queue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.queue.append(exchange)
        if len(self.queue) == 1:
            self._begin(exchange)

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange.upstream is not None:
            exchange.upstream.write_body(body, exchange.chunked)
        elif exchange.local is None and not exchange.finished:
            exchange.body.append(body)

    def on_message_complete(self) -> None:
        exchange = self.parsing
        exchange.body_done = True
        if exchange.upstream is not None:
            exchange.upstream.end_body(exchange.chunked)
        if len(self.queue) > 1:
            self.transport.pause_reading()  # pipelined: read on once the answers before it went out

    # ----- answering -----

    def _begin(self, exchange: _Exchange) -> None:
        if exchange.local is not None:
            self.transport.write(exchange.local)
            self.finish(exchange, reusable=True)
            return
        instance = exchange.instance
        assert instance is not None  # route() gave the exchange either an answer of our own or its instance
        instance.in_flight += 1
        self.edge.connect(exchange, instance, self)

    def fail(self, exchange: _Exchange, status: int, text: str) -> None:
        """The app could not answer: say so if nothing went out yet, else cut the connection."""
        if exchange.finished:
            return
        if exchange.answered:
            self.finish(exchange, reusable=False)
            self.transport.close()
            return
        exchange.answered = True
        self.transport.write(_plain_response(status, text, close=not exchange.body_done or exchange.upgrade))
        self.finish(exchange, reusable=exchange.body_done and not exchange.upgrade)

    def finish(self, exchange: _Exchange, reusable: bool) -> None:
        """The answer is out: take the next pipelined request, or close if the client asked to."""
        if exchange.finished:
            return
        exchange.finished = True
        if exchange.instance is not None:
            exchange.instance.in_flight -= 1
        if self.queue and self.queue[0] is exchange:
            self.queue.popleft()
        if not (reusable and exchange.keep_alive) or exchange.upgrade:
            self.transport.close()
            return
        if self.queue:
            self._begin(self.queue[0])
            self.transport.resume_reading()
        else:
            self._idle_timer = asyncio.get_running_loop().call_later(IDLE_TIMEOUT, self.transport.close)

    def open_tunnel(self, upstream: asyncio.Transport) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.tunnel = upstream
        if self.early:
            upstream.write(self.early)
            self.early = b""

    # ----- transport events -----

    def pause_writing(self) -> None:  # the visitor reads slower than the app answers
        if (peer := self._peer()) is not None:
            peer.pause_reading()

    def resume_writing(self) -> None:
        if (peer := self._peer()) is not None:
            peer.resume_reading()

    def _peer(self) -> asyncio.Transport | None:
        """Where what the visitor is sent comes from: the tunnel, or the answering app's connection."""
        return self.tunnel or (self.queue[0].upstream.transport if self.queue and self.queue[0].upstream else None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.edge.clients.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self.tunnel is not None:
            self.tunnel.close()
        for exchange in self.queue:
            if exchange.upstream is not None:
                exchange.upstream.transport.close()  # mid-answer: that connection can't be reused
            if not exchange.finished:
                exchange.finished = True
                if exchange.instance is not None and exchange.local is None and exchange is self.queue[0]:
                    exchange.instance.in_flight -= 1
        self.queue.clear()


class UpstreamConnection(asyncio.Protocol):
    """A kept-alive connection to one instance, carrying one exchange at a time."""

    def __init__(self, edge: AppsEdge, path: str, preamble: bytes = b"") -> None:
        """path: the instance's address (its socket, or its runner's relay, which first takes `preamble`)."""
        self.edge, self.path, self.preamble = edge, path, preamble
        self.exchange: _Exchange | None = None
        self.client: ClientConnection | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self.chunked_answer = False  # we chunk-encode it for the visitor
        self.close_delimited = False  # the app ends its answer by closing the connection
        self.tunnel: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's
        if self.preamble:
            self.transport.write(self.preamble)

    def send(self, exchange: _Exchange, client: ClientConnection) -> None:
        """Write the request head (and the body that arrived so far) and wait for the answer."""
        self.exchange, self.client = exchange, client
        exchange.upstream = self
        self.parser = httptools.HttpResponseParser(self)
        self.headers, self.reason = [], b""
        headers = app_request_headers(exchange.headers, forwarded_headers(
            client.client_ip, "https" if self.edge.deploys.https else "http", exchange.host, exchange.prefix),
            exchange.upgrade)
        if exchange.chunked:
            headers.append((b"transfer-encoding", b"chunked"))
        head = [exchange.method + b" " + exchange.target.encode("latin-1") + b" HTTP/1.1"]
        head += [name + b": " + value for name, value in headers]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n")
        for piece in exchange.body:
            self.write_body(piece, exchange.chunked)
        exchange.body.clear()
        if exchange.body_done:
            self.end_body(exchange.chunked)
        self._timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT, self._too_slow)

    def write_body(self, piece: bytes, chunked: bool) -> None:
        if piece:
            self.transport.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)

    def end_body(self, chunked: bool) -> None:
        if chunked:
            self.transport.write(b"0\r\n\r\n")

    def _answering(self) -> tuple[_Exchange, ClientConnection, httptools.HttpResponseParser]:
        """The exchange this connection carries, its client and the answer's parser: all set from `send` to
        `_done` together, the only time the parser calls back."""
        exchange, client, parser = self.exchange, self.client, self.parser
        assert exchange is not None and client is not None and parser is not None
        return exchange, client, parser

    def _too_slow(self) -> None:
        if self.exchange is not None and self.client is not None and not self.exchange.answered:
            self.client.fail(self.exchange, 504, "The app took too long to answer.")
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel.write(data)
            return
        if self.parser is None:  # an idle connection the app wrote to: not HTTP we asked for
            self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._become_tunnel(data[upgrade.args[0]:])
        except httptools.HttpParserError as exc:
            log.info("app at %s sent a malformed answer: %s", self.path, exc)
            if self.client is not None and self.exchange is not None:  # (not when garbage followed a whole answer)
                self.client.fail(self.exchange, 502, "The app sent a malformed answer.")
            self.transport.close()

    # ----- httptools callbacks -----

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        exchange, client, parser = self._answering()
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.headers, self.reason = [], b""  # an interim answer (103 Early Hints): wait for the real one
            return
        headers = app_response_headers(self.headers, exchange.own_host)
        names = {name for name, _ in self.headers}
        has_body = exchange.method != b"HEAD" and status not in (204, 304) and status != 101
        unframed = has_body and b"content-length" not in names
        self.close_delimited = unframed and b"transfer-encoding" not in names
        self.chunked_answer = unframed and not exchange.http10
        if unframed and exchange.http10:
            exchange.keep_alive = False  # an HTTP/1.0 visitor knows the end only by the connection closing
        if self.chunked_answer:
            headers.append((b"transfer-encoding", b"chunked"))
        if status == 101:
            headers += [(b"connection", b"upgrade")] + [(n, v) for n, v in self.headers if n == b"upgrade"]
        elif not exchange.keep_alive or exchange.upgrade:
            headers.append((b"connection", b"close"))
        head = [b"HTTP/1.1 %d %s" % (status, self.reason or REASONS.get(status, b"OK"))]
        head += [name + b": " + value for name, value in headers]
        exchange.answered = True
        client.transport.write(b"\r\n".join(head) + b"\r\n\r\n")
        if exchange.method == b"HEAD":
            self._done(reusable=parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.client is not None:
            self.client.transport.write(b"%x\r\n%b\r\n" % (len(body), body) if self.chunked_answer else body)

    def on_message_complete(self) -> None:
        exchange, client, parser = self.exchange, self.client, self.parser
        if exchange is None or client is None or parser is None or not exchange.answered \
                or parser.get_status_code() == 101:
            return
        if self.chunked_answer:
            client.transport.write(b"0\r\n\r\n")
        self._done(reusable=parser.should_keep_alive() and exchange.body_done)

    def _done(self, reusable: bool) -> None:
        exchange, client, _ = self._answering()
        self.exchange = self.client = self.parser = None
        exchange.upstream = None
        if reusable:
            self.edge.keep(self)
        else:
            self.transport.close()
        client.finish(exchange, reusable=exchange.body_done)

    def _become_tunnel(self, rest: bytes) -> None:
        """The app took the upgrade: from now on bytes pass both ways as they are."""
        _, client, _ = self._answering()
        self.tunnel = client.transport
        if rest:
            self.tunnel.write(rest)
        client.open_tunnel(self.transport)

    # ----- transport events -----

    def pause_writing(self) -> None:  # the app reads the request body slower than the visitor sends it
        if self.client is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client is not None:
            self.client.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.edge.forget(self)
        if self.tunnel is not None:
            self.tunnel.close()
            return
        exchange, client = self.exchange, self.client
        if exchange is None or client is None or exchange.finished:
            return
        if exchange.answered and self.close_delimited:  # the closing was the end of its body
            if self.chunked_answer:
                client.transport.write(b"0\r\n\r\n")
            self.exchange = None
            client.finish(exchange, reusable=exchange.body_done)
            return
        client.fail(exchange, 502, "The app did not answer.")  # (mid-body: the visitor's connection is cut)
