"""Frames between an accepted client WebSocket and an upstream one, both ways, until either ends.

Three users: the apps' proxy (a visitor's socket to an app), a run's socket opened on a replica
that does not run it (served by the one that does, sandbox.run_relay), and a collab socket opened on
a `serve --workers` worker that does not host the project's rooms (collab.api.editing). The
upstream's close code and reason reach the client, so "access revoked" (4403) or a run's own 4404
read the same relayed.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from starlette.types import Scope
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.typing import Origin

NO_STATUS = (1005, 1006)  # "no close frame" codes: not sendable in a close frame of our own
CREDENTIALS = ("cookie", "authorization", "x-csrf-token")  # what a relayed request carries of the client's

log = logging.getLogger(__name__)


def request_target(scope: Scope) -> str:
    """The path and query as the client sent them (still percent-encoded)."""
    raw: str = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    return raw + (f"?{query}" if query else "")


async def relay_to(websocket: WebSocket, address: str) -> bool:
    """Relay an accepted socket to the same path on the server at `address` ("host:port") with the client's
    own credentials: that server checks them and the caller's access again. The Origin sent is that server's
    own, as its cross-site check expects; this one checked the client's. False if it does not answer
    (nothing was relayed; the socket is still open)."""
    path = request_target(websocket.scope)
    headers = [(name, value) for name in CREDENTIALS if (value := websocket.headers.get(name))]
    try:
        upstream = await connect(f"ws://{address}{path}", additional_headers=headers, origin=Origin(f"http://{address}"),
                                 open_timeout=10, max_size=None, compression=None)
    except (TimeoutError, OSError, InvalidHandshake) as exc:
        log.warning("could not reach the server at %s for %s: %s", address, path, exc)
        return False
    async with upstream:
        await relay(websocket, upstream)
    return True


async def relay(websocket: WebSocket, upstream: ClientConnection) -> None:
    async def client_to_upstream() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(message.get("code", 1000))
                return
            await upstream.send(message["bytes"] if message.get("bytes") is not None else message.get("text", ""))

    async def upstream_to_client() -> None:
        try:
            async for message in upstream:
                await (websocket.send_bytes(message) if isinstance(message, bytes) else websocket.send_text(message))
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        with suppress(Exception):
            await websocket.close(code if code not in NO_STATUS else 1000,
                                  (upstream.close_reason or "") if code not in NO_STATUS else "")

    tasks = [asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with suppress(WebSocketDisconnect, RuntimeError, ConnectionClosed):
            await websocket.close()
