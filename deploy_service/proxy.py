"""The apps' reverse proxy: /apps/{slug}/... (and {slug}.apps.<host>) to a live instance, round-robin.

It is a plain ASGI middleware in front of the app (no routing, dependency or request-log work
per request: the proxy's throughput is bounded by CPU). HTTP bodies stream both ways
(deploy_service.upstream over the instance's unix socket, keep-alive connections kept per
instance); WebSockets are relayed frame by frame. Each request counts as in flight on the
instance that took it, so a switch can drain the old release before stopping it.

The app shares the IDE's origin under /apps/: the proxy never passes Codeyard's own cookies to
it, drops cookies it tries to set under Codeyard's names, and sends every response with a CSP
`sandbox` (no allow-same-origin), so the app's pages run in an opaque origin and cannot use
the visitor's IDE session. Serving apps on their own host name (`{slug}.apps.<host>`) avoids the
shared origin altogether.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import InvalidHandshake, InvalidStatus

from deploy_service.instance import AppInstance
from deploy_service.owner import Replica
from deploy_service.upstream import Upstream, UpstreamError
from ide_server.wiring import required, services_of
from ide_server.ws_relay import relay, request_target

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade", b"proxy-connection", b"expect"})
PRIVATE_COOKIE_PREFIX = "codeyard_"
OWN_HOST = "codeyard.app_host"  # scope key: the request came by the app's own host name
# Headers that act on the whole origin, which under /apps/ is the IDE's: the proxy sets the CSP itself.
ORIGIN_WIDE = frozenset({b"content-security-policy", b"clear-site-data", b"service-worker-allowed"})
SANDBOX_CSP = b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"
WS_REQUEST_HEADERS_DROPPED = frozenset({"connection", "upgrade", "host", "sec-websocket-key", "sec-websocket-version",
                                        "sec-websocket-extensions", "sec-websocket-protocol", "cookie", "origin"})
APP_PATH = re.compile(rb"^/apps/([a-z0-9][a-z0-9-]*)(/[^?]*)?$")
DEPLOY_API = re.compile(r"^/api/projects/[^/]+/deployments?(/|$)")  # what only the replica running the apps can answer


@dataclass(frozen=True)
class Route:
    """Where a slug's traffic goes now: replaced whole on a switch, so a request sees one or the other."""

    instances: tuple[AppInstance, ...]
    reason: str = ""  # why nothing serves (stopped, restarting), for the 503

    def __post_init__(self) -> None:
        object.__setattr__(self, "_turn", itertools.count())

    def pick(self) -> AppInstance | None:
        live = [i for i in self.instances if not i.exited]
        if not live:
            return None
        return live[next(self._turn) % len(live)]  # type: ignore[attr-defined]


class Routes:
    """slug -> Route, read by every proxied request."""

    def __init__(self) -> None:
        self._by_slug: dict[str, Route] = {}

    def set(self, slug: str, route: Route) -> None:
        self._by_slug[slug] = route

    def drop(self, slug: str) -> None:
        self._by_slug.pop(slug, None)

    def get(self, slug: str) -> Route | None:
        return self._by_slug.get(slug)

    def clear(self) -> None:
        self._by_slug.clear()


NO_APP = "No app is deployed here."


def unavailable(route: Route | None) -> tuple[int, str, list[tuple[bytes, bytes]]]:
    """The answer (status, text, headers) when no instance can take a request: no such app, or none serving."""
    if route is None:
        return 404, NO_APP, []
    return 503, f"The app is not available right now: {route.reason or 'no healthy instance'}.", [(b"retry-after", b"2")]


def _without_private_cookies(value: str) -> str:
    kept = [c for c in value.split(";") if not c.strip().startswith(PRIVATE_COOKIE_PREFIX)]
    return ";".join(kept).strip()


def forwarded_headers(client_ip: str, scheme: str, host: bytes, prefix: str) -> list[tuple[bytes, bytes]]:
    """Who asked and how, for the app (the client's own X-Forwarded-* never pass)."""
    headers = [(b"x-forwarded-for", client_ip.encode()), (b"x-forwarded-proto", scheme.encode()),
               (b"x-forwarded-host", host)]
    return headers + ([(b"x-forwarded-prefix", prefix.encode())] if prefix else [])


def app_request_headers(headers: list[tuple[bytes, bytes]], forwarded: list[tuple[bytes, bytes]],
                        upgrade: bool = False) -> list[tuple[bytes, bytes]]:
    """The request's headers as the app gets them: no hop-by-hop ones (an upgrade keeps its
    Upgrade header), no client-sent X-Forwarded-*, none of Codeyard's cookies."""
    kept = []
    for name, value in headers:
        if name in HOP_BY_HOP or name.startswith(b"x-forwarded-"):
            if upgrade and name == b"upgrade":
                kept += [(b"connection", b"upgrade"), (name, value)]
            continue
        if name == b"cookie":
            value = _without_private_cookies(value.decode("latin-1")).encode("latin-1")
            if not value:
                continue
        kept.append((name, value))
    return kept + forwarded


def _forwarded(scope: Scope, prefix: str) -> list[tuple[bytes, bytes]]:
    client = scope.get("client") or ("", 0)
    return forwarded_headers(client[0], scope.get("scheme", "http"), dict(scope["headers"]).get(b"host", b""), prefix)


def _request_headers(scope: Scope, prefix: str) -> list[tuple[bytes, bytes]]:
    return app_request_headers(scope["headers"], _forwarded(scope, prefix))


def app_response_headers(headers: list[tuple[bytes, bytes]], own_host: bool) -> list[tuple[bytes, bytes]]:
    kept = []
    for name, value in headers:
        if name in HOP_BY_HOP or (name in ORIGIN_WIDE and not own_host):
            continue
        if name == b"set-cookie" and value.strip().lower().startswith(PRIVATE_COOKIE_PREFIX.encode()):
            continue
        kept.append((name, value))
    if not own_host:
        kept.append((b"content-security-policy", SANDBOX_CSP))
    return kept


async def plain_response(send: Send, status: int, text: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class _ClientGone(Exception):
    pass


class AppsProxy:
    """/apps/{slug}/... to a live instance of the slug's app (an ASGI app)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        routes: Routes = required(services_of(scope["app"].state).deploys, "deploys").routes
        match = APP_PATH.match(scope.get("raw_path") or scope["path"].encode())
        if scope["type"] == "websocket":
            websocket = WebSocket(scope, receive, send)
            if match is None or match.group(2) is None:
                await websocket.close(1008, "no app is serving here")
                return
            await proxy_websocket(websocket, routes, match.group(1).decode())
            return
        if scope["type"] != "http":
            return
        if match is None:
            await plain_response(send, 404, NO_APP)
        elif match.group(2) is None:  # /apps/{slug}: relative links need the trailing slash
            query = scope.get("query_string", b"")
            await plain_response(send, 308, "", [(b"location", match.group(0) + b"/" + (b"?" + query if query else b""))])
        else:
            await _proxy_http(scope, receive, send, routes, match.group(1).decode())


async def _proxy_http(scope: Scope, receive: Receive, send: Send, routes: Routes, slug: str) -> None:
    route = routes.get(slug)
    instance = route.pick() if route else None
    if instance is None or instance.upstream is None:
        await plain_response(send, *unavailable(route))
        return
    path, prefix = _upstream_path(scope, slug)
    own_host = OWN_HOST in scope
    instance.in_flight += 1
    try:
        await relay_http(scope, receive, send, instance.upstream, path, _request_headers(scope, prefix),
                          lambda headers: app_response_headers(headers, own_host))
    finally:
        instance.in_flight -= 1


async def relay_http(scope: Scope, receive: Receive, send: Send, upstream: Upstream, target: str,
                      request_headers: list[tuple[bytes, bytes]],
                      response_headers: Callable[[list[tuple[bytes, bytes]]], list[tuple[bytes, bytes]]]) -> None:
    """Send the request on (its body streamed) and stream the answer back; 502 if none comes."""
    headers = dict(scope["headers"])
    chunked = b"content-length" not in headers and b"chunked" in headers.get(b"transfer-encoding", b"").lower()
    request_headers = request_headers + ([(b"transfer-encoding", b"chunked")] if chunked else [])

    async def body() -> AsyncIterator[bytes]:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone()
            yield message.get("body", b"")
            if not message.get("more_body"):
                return

    has_body = b"content-length" in headers or chunked
    response = None
    try:
        try:
            response = await upstream.request(scope["method"], target, request_headers,
                                              body() if has_body else None, chunked)
        except UpstreamError as exc:
            log.info("%s: %s", upstream.address, exc)
            await plain_response(send, 502, "The app did not answer.")
            return
        await send({"type": "http.response.start", "status": response.status,
                    "headers": response_headers(response.headers)})
        if (whole := response.whole_body()) is not None:  # it came with the head: one write
            await send({"type": "http.response.body", "body": whole})
            return
        try:
            async for chunk in response.body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError:
            pass  # the app broke off mid-body: the client sees the body end
        await send({"type": "http.response.body", "body": b""})
    except _ClientGone:
        pass
    finally:
        if response is not None:
            response.close()


def _upstream_path(scope: Scope, slug: str) -> tuple[str, str]:
    """(path with query as the app should see it, the prefix it is served under: none on its own host)."""
    prefix = f"/apps/{slug}"
    path = request_target(scope)[len(prefix):]
    return path if path.startswith("/") else "/" + path, "" if OWN_HOST in scope else prefix


async def proxy_websocket(websocket: WebSocket, routes: Routes, slug: str) -> None:
    route = routes.get(slug)
    instance = route.pick() if route else None
    if instance is None:
        await websocket.close(1013 if route else 1008, "no app is serving here")
        return
    path, prefix = _upstream_path(websocket.scope, slug)
    instance.in_flight += 1
    try:
        await relay_websocket(websocket, prefix, lambda **options: _connect_instance(instance, path, options))
    finally:
        instance.in_flight -= 1


async def _connect_instance(instance: AppInstance, path: str, options: dict[str, Any]) -> ClientConnection:
    """A WebSocket to the instance: on its socket, or through its runner's relay (the relay's token sent first)."""
    if instance.address.startswith("/"):
        return await unix_connect(instance.address, f"ws://app{path}", **options)
    host, _, port = instance.address.rpartition(":")

    def opened() -> socket.socket:
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(instance.preamble)
        sock.setblocking(False)
        return sock

    return await connect(f"ws://app{path}", sock=await asyncio.to_thread(opened), **options)


async def relay_websocket(websocket: WebSocket, prefix: str, connect_upstream: Callable[..., Awaitable[Any]]) -> None:
    """Open the upstream WebSocket (with the visitor's subprotocols and headers), accept, relay frames."""
    protocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    headers = [(k, v) for k, v in websocket.headers.items() if k not in WS_REQUEST_HEADERS_DROPPED
               and not k.startswith("x-forwarded-")]
    headers += [(k.decode(), v.decode("latin-1")) for k, v in _forwarded(websocket.scope, prefix)]
    try:
        upstream = await connect_upstream(subprotocols=protocols or None, additional_headers=headers,
                                          open_timeout=10, compression=None)
    except (TimeoutError, OSError, InvalidHandshake, InvalidStatus) as exc:
        log.info("websocket upstream refused: %s", exc)
        await websocket.close(1011, "the app refused the connection")
        return
    async with upstream:
        await websocket.accept(subprotocol=upstream.subprotocol)
        await relay(websocket, upstream)


@lru_cache(maxsize=8)
def app_host_pattern(apps_host: str) -> re.Pattern[str]:
    return re.compile(rf"^([a-z0-9][a-z0-9-]*)\.apps\.{re.escape(apps_host.lower())}(:\d+)?$")


class AppsGateway:
    """ASGI middleware in front of the whole app: app traffic (/apps/{slug}/..., or any path on
    `{slug}.apps.<host>` when the deploys have a host) goes straight to the proxy, skipping the
    IDE's routing and request log; on a replica that does not run the apps, app traffic and deploy
    calls go on to the one that does (deploy_service.owner); everything else passes on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.proxy = AppsProxy()
        self._owners: dict[str, Upstream] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            deploys = services_of(scope["app"].state).deploys if "app" in scope else None
            if deploys is None:
                await self.app(scope, receive, send)
                return
            app_scope = _as_app_request(scope, deploys.apps_host)
            ownership = deploys.ownership
            if not ownership.is_owner and (app_scope is not None or (scope["type"] == "http"
                                                                     and DEPLOY_API.match(scope["path"]))):
                await self._forward(scope, app_scope, receive, send, ownership.owner)
                return
            if app_scope is not None:
                await self.proxy(app_scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _forward(self, scope: Scope, app_scope: Scope | None, receive: Receive, send: Send,
                       owner: Replica | None) -> None:
        """To the replica that runs the apps, as it came (it is one of us: cookies and all)."""
        if owner is None:
            if scope["type"] == "websocket":
                await WebSocket(scope, receive, send).close(1013, "the apps are moving to another replica")
            else:
                await plain_response(send, 503, "Deploys are moving to another server; try again in a few seconds.",
                                     [(b"retry-after", b"5")])
            return
        # (a WebSocket goes in path form: the owner can't see the Host of a host-mode app)
        path = request_target(app_scope or scope) if scope["type"] == "websocket" else request_target(scope)
        await forward_as_is(scope, receive, send, owner.http, path, self._owners)


async def forward_as_is(scope: Scope, receive: Receive, send: Send, address: str, path: str,
                        upstreams: dict[str, Upstream]) -> None:
    """A request or WebSocket to `path` on another of our servers at `address` ("host:port"), as it came
    (cookies and all): the replica running the apps, or the `serve --workers` worker running a Webview's
    run. `upstreams` keeps the connection pool to the last address asked."""
    if scope["type"] == "websocket":
        await relay_websocket(WebSocket(scope, receive, send), "",
                              lambda **options: connect(f"ws://{address}{path}", **options))
        return
    if (upstream := upstreams.get(address)) is None:
        for old in upstreams.values():
            old.close()
        upstreams.clear()
        upstream = upstreams[address] = Upstream(address)
    client = scope.get("client") or ("", 0)
    headers = [(n, v) for n, v in scope["headers"] if n not in HOP_BY_HOP and n != b"x-forwarded-for"]
    headers.append((b"x-forwarded-for", client[0].encode()))
    await relay_http(scope, receive, send, upstream, path, headers,
                     lambda answer: [(n, v) for n, v in answer if n not in HOP_BY_HOP])


def _as_app_request(scope: Scope, apps_host: str | None) -> Scope | None:
    """The scope in /apps/{slug}/ form if it is an app's traffic (by path, or by host name), else None."""
    if apps_host:
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
        if match := app_host_pattern(apps_host).match(host):
            prefix = f"/apps/{match.group(1)}"
            raw = scope.get("raw_path") or scope["path"].encode()
            return {**scope, "path": prefix + scope["path"], "raw_path": prefix.encode() + raw, OWN_HOST: True}
    return scope if scope["path"].startswith("/apps/") else None
