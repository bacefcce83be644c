"""The Webview's proxy: /preview/{token}/... to the web app a run started from the editor serves.

The apps proxy's relay, header policy and sandboxing CSP serve it (deploy_service.proxy), so a
preview is what the app will be once deployed, in an opaque origin of its own that cannot use the
visitor's IDE session. Only the run's watchers, the project's members, learn a token, each their own
(sandbox.preview); it dies with the run, or when its member leaves the project: each request checks
that the token's member still is one, and the events hub's notice ends their open WebSockets (the
notice reaches every replica, whichever one the member was removed through).
The session cookie cannot be the check, as the page's own requests come from its opaque origin
(cross-site: no cookie). Requests reach the run through its bridge's unix socket (the run's network
stays empty), on the replica that runs it. Under `serve --workers` a token begins with its worker's
tag (Settings.worker_tag), and another worker sends the request there as it came.
"""

from __future__ import annotations

import asyncio
import re
from contextlib import suppress
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket
from websockets.asyncio.client import ClientConnection, unix_connect

from deploy_service.proxy import (
    app_request_headers,
    app_response_headers,
    forward_as_is,
    forwarded_headers,
    plain_response,
    relay_http,
    relay_websocket,
)
from deploy_service.upstream import READ_CHUNK, Upstream
from ide_server.wiring import services_of
from ide_server.ws_relay import request_target
from sandbox.frames import SOCKET_GONE
from sandbox.preview import Preview, preview_path
from sandbox.run_queue import RunRecord
from sandbox.service import ProjectRuns

PREVIEW_PATH = re.compile(rb"^/preview/([A-Za-z0-9_-]{16,64})(/[^?]*)?$")
NO_PREVIEW = "No program is serving here: run it again from its workspace."
NOT_LISTENING = "The program is running but listens on no port yet (a web app listens on 127.0.0.1:$PORT, which is 8080)."
NO_REFERRER = (b"referrer-policy", b"no-referrer")  # the secret path never leaves in a Referer
NOT_A_MEMBER = 4403  # the WebSocket's member left the project


class _RunUpstream(Upstream):
    """The apps' HTTP/1.1 client, over connections to a run's bridge checked by Preview.connect."""

    def __init__(self, preview: Preview) -> None:
        super().__init__(preview.socket_path)
        self.preview = preview

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(sock=await self.preview.connect(), limit=READ_CHUNK)


class PreviewGateway:
    """ASGI middleware: /preview/{token}/... goes to the run's app, everything else passes on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._upstreams: dict[str, _RunUpstream] = {}
        self._workers: dict[str, Upstream] = {}  # the connection pool to another worker (forward_as_is)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") or scope.get("path", "").encode()
        if scope["type"] not in ("http", "websocket") or not raw.startswith(b"/preview/"):
            await self.app(scope, receive, send)
            return
        match = PREVIEW_PATH.match(raw)
        runs = services_of(scope["app"].state).runs
        live = await self._live(runs, match.group(1).decode()) if match and runs else None
        elsewhere = scope["app"].state.settings.tagged_worker(match.group(1).decode()) if match else None
        if live is None and elsewhere is not None:  # a run of another `serve --workers` worker: it answers
            await forward_as_is(scope, receive, send, elsewhere, request_target(scope), self._workers)
        elif scope["type"] == "websocket":
            await self._websocket(WebSocket(scope, receive, send), live, match)
        elif live is None or match is None:  # (a live run was looked up only with a match)
            await plain_response(send, 404, NO_PREVIEW)
        elif match.group(2) is None:  # relative links need the trailing slash
            await plain_response(send, 308, "", [(b"location", match.group(0) + b"/")])
        else:
            await self._http(scope, receive, send, live[0], live[1], match)

    @staticmethod
    async def _live(runs: ProjectRuns, token: str) -> tuple[RunRecord, Preview, str] | None:
        """The run, Webview and token for a request, while the token's member is still a member."""
        found = runs.preview_of(token)
        if found is None:
            return None
        record, preview, user_id = found
        if not await run_in_threadpool(runs.still_member, record, user_id):
            preview.revoke(user_id)
            return None
        return record, preview, token

    def _target(self, scope: Scope, match: re.Match[bytes]) -> tuple[str, list[tuple[bytes, bytes]]]:
        """The path as the app sees it, and who asked (X-Forwarded-*, with the prefix it is served under)."""
        query = scope.get("query_string", b"")
        target = match.group(2).decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
        client = scope.get("client") or ("", 0)
        host = dict(scope["headers"]).get(b"host", b"")
        prefix = preview_path(match.group(1).decode()).rstrip("/")
        return target, forwarded_headers(client[0], scope.get("scheme", "http"), host, prefix)

    def _upstream(self, preview: Preview) -> _RunUpstream:
        """The run's connection pool (one per run, whichever member's token asked)."""
        for folder in [f for f, u in self._upstreams.items() if not u.preview.folder.exists()]:
            self._upstreams.pop(folder).close()  # runs that ended
        if (upstream := self._upstreams.get(str(preview.folder))) is None:
            upstream = self._upstreams[str(preview.folder)] = _RunUpstream(preview)
        return upstream

    async def _http(self, scope: Scope, receive: Receive, send: Send, record: RunRecord, preview: Preview,
                    match: re.Match[bytes]) -> None:
        if record.listening_port is None:
            await plain_response(send, 503, NOT_LISTENING, [(b"retry-after", b"1")])
            return
        preview.point_at(record.listening_port)
        target, forwarded = self._target(scope, match)
        await relay_http(scope, receive, send, self._upstream(preview), target,
                         app_request_headers(scope["headers"], forwarded),
                         lambda headers: [*app_response_headers([h for h in headers if h[0] != NO_REFERRER[0]], False),
                                          NO_REFERRER])

    async def _websocket(self, websocket: WebSocket, live: tuple[RunRecord, Preview, str] | None,
                         match: re.Match[bytes] | None) -> None:
        port = live[0].listening_port if live is not None else None
        if live is None or match is None or match.group(2) is None or port is None:
            await websocket.close(1008, "no program is serving here")
            return
        _, preview, token = live
        preview.point_at(port)
        target, _ = self._target(websocket.scope, match)

        async def connect(**options: Any) -> ClientConnection:
            return await unix_connect(sock=await preview.connect(), uri=f"ws://app{target}", **options)

        relay = asyncio.ensure_future(relay_websocket(websocket, preview_path(token).rstrip("/"), connect))

        async def take_back() -> None:  # the member left the project
            with suppress(*SOCKET_GONE):
                await websocket.close(NOT_A_MEMBER, "you are no longer a member of this project")
            relay.cancel()

        ending: list[asyncio.Future[None]] = []
        forget = preview.hold(token, lambda: ending.append(asyncio.ensure_future(take_back())))
        try:
            await asyncio.wait([relay])
        finally:
            forget()
            relay.cancel()
            await asyncio.gather(*ending, return_exceptions=True)
        if not relay.cancelled():
            relay.result()  # its error, if it failed
