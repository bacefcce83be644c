"""The apps' reverse proxy: /apps/{slug}/... (and {slug}.apps.<host>) to a live instance, round-robin.

HTTP bodies stream both ways (httpx over the instance's unix socket, keep-alive connections
pooled per instance); WebSockets are relayed frame by frame. Each request counts as in flight on
the instance that took it, so a switch can drain the old release before stopping it.

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
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from deploy_service.instance import AppInstance

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "proxy-connection"})
PRIVATE_COOKIE_PREFIX = "codeyard_"
OWN_HOST = "codeyard.app_host"  # scope key: the request came by the app's own host name
SANDBOX_CSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"
WS_REQUEST_HEADERS_DROPPED = HOP_BY_HOP | {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                                          "sec-websocket-protocol", "cookie", "origin"}


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


def _without_private_cookies(value: str) -> str:
    kept = [c for c in value.split(";") if not c.strip().startswith(PRIVATE_COOKIE_PREFIX)]
    return ";".join(kept).strip()


def _request_headers(request: Request | WebSocket, prefix: str, dropped: frozenset[str]) -> list[tuple[str, str]]:
    headers = []
    for name, value in request.headers.items():
        if name in dropped:
            continue
        if name == "cookie":
            value = _without_private_cookies(value)
            if not value:
                continue
        headers.append((name, value))
    client = request.client.host if request.client else ""
    headers += [("x-forwarded-for", client), ("x-forwarded-proto", request.url.scheme),
                ("x-forwarded-host", request.headers.get("host", "")), ("x-forwarded-prefix", prefix)]
    return headers


def _response_headers(response: httpx.Response, own_host: bool) -> list[tuple[bytes, bytes]]:
    headers = []
    for name, value in response.headers.raw:
        lower = name.lower()
        if lower.decode("latin-1") in HOP_BY_HOP or (lower == b"content-security-policy" and not own_host):
            continue
        if lower == b"set-cookie" and value.strip().lower().startswith(PRIVATE_COOKIE_PREFIX.encode()):
            continue
        headers.append((lower, value))
    if not own_host:
        headers.append((b"content-security-policy", SANDBOX_CSP.encode()))
    return headers


def _unavailable(route: Route | None) -> Response:
    if route is None:
        return PlainTextResponse("No app is deployed here.", status_code=404)
    return PlainTextResponse(f"The app is not available right now: {route.reason or 'no healthy instance'}.",
                             status_code=503, headers={"Retry-After": "2"})


def _upstream_path(scope: Scope, slug: str) -> tuple[str, str]:
    """(path with query as the app should see it, the prefix it is served under)."""
    prefix = f"/apps/{slug}"
    raw = scope.get("raw_path") or scope["path"].encode()
    path = raw.decode("latin-1")[len(prefix):] or "/"
    query = scope.get("query_string", b"").decode("latin-1")
    return path + (f"?{query}" if query else ""), prefix


async def proxy_http(request: Request, routes: Routes, slug: str) -> Response:
    route = routes.get(slug)
    instance = route.pick() if route else None
    if instance is None or instance.client is None:
        return _unavailable(route)
    path, prefix = _upstream_path(request.scope, slug)
    instance.in_flight += 1
    done = False

    def finish() -> None:
        nonlocal done
        if not done:
            done = True
            instance.in_flight -= 1

    try:
        has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
        upstream = instance.client.build_request(
            request.method, path, headers=_request_headers(request, prefix, HOP_BY_HOP),
            content=request.stream() if has_body else None)
        response = await instance.client.send(upstream, stream=True)
    except httpx.HTTPError as exc:
        finish()
        log.info("app %s: upstream error %s", slug, exc)
        return PlainTextResponse("The app did not answer.", status_code=502)
    except BaseException:
        finish()
        raise

    async def body():
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            pass  # the app went away mid-body: the client sees the body end
        finally:
            await response.aclose()
            finish()

    async def close() -> None:
        await response.aclose()
        finish()

    return _Streaming(body(), status_code=response.status_code, headers=_response_headers(response, OWN_HOST in request.scope),
                      background=BackgroundTask(close))


class _Streaming(StreamingResponse):
    """A StreamingResponse taking raw header pairs (repeated Set-Cookie kept, nothing added)."""

    def __init__(self, content, status_code: int, headers: list[tuple[bytes, bytes]], background: BackgroundTask) -> None:
        super().__init__(content, status_code=status_code, background=background)
        self.raw_headers = headers


async def proxy_websocket(websocket: WebSocket, routes: Routes, slug: str) -> None:
    route = routes.get(slug)
    instance = route.pick() if route else None
    if instance is None:
        await websocket.close(1013 if route else 1008, "no app is serving here")
        return
    path, prefix = _upstream_path(websocket.scope, slug)
    protocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    headers = _request_headers(websocket, prefix, WS_REQUEST_HEADERS_DROPPED)
    instance.in_flight += 1
    try:
        try:
            upstream = await unix_connect(str(instance.socket_path), f"ws://app{path}", subprotocols=protocols or None,
                                          additional_headers=headers, open_timeout=10, compression=None)
        except (OSError, InvalidHandshake, InvalidStatus, asyncio.TimeoutError) as exc:
            log.info("app %s: websocket upstream refused: %s", slug, exc)
            await websocket.close(1011, "the app refused the connection")
            return
        async with upstream:
            await websocket.accept(subprotocol=upstream.subprotocol)
            await _relay(websocket, upstream)
    finally:
        instance.in_flight -= 1


async def _relay(websocket: WebSocket, upstream) -> None:
    async def client_to_app() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(message.get("code", 1000))
                return
            await upstream.send(message["bytes"] if message.get("bytes") is not None else message.get("text", ""))

    async def app_to_client() -> None:
        try:
            async for message in upstream:
                await (websocket.send_bytes(message) if isinstance(message, bytes) else websocket.send_text(message))
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        with suppress(Exception):
            await websocket.close(code if code not in (1005, 1006) else 1000)

    tasks = [asyncio.create_task(client_to_app()), asyncio.create_task(app_to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with suppress(WebSocketDisconnect, RuntimeError, ConnectionClosed):
            await websocket.close()


@lru_cache(maxsize=8)
def _host_pattern(apps_host: str) -> re.Pattern[str]:
    return re.compile(rf"^([a-z0-9][a-z0-9-]*)\.apps\.{re.escape(apps_host.lower())}(:\d+)?$")


class AppHostRouting:
    """ASGI middleware: requests for `{slug}.apps.<host>` go to /apps/{slug}/... (when the deploys have a host)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        deploys = getattr(scope["app"].state, "deploys", None) if "app" in scope else None
        if deploys is not None and deploys.apps_host and scope["type"] in ("http", "websocket"):
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            if match := _host_pattern(deploys.apps_host).match(host):
                prefix = f"/apps/{match.group(1)}"
                raw = scope.get("raw_path") or scope["path"].encode()
                scope = {**scope, "path": prefix + scope["path"], "raw_path": prefix.encode() + raw, OWN_HOST: True}
        await self.app(scope, receive, send)
