"""A run's socket or cancel reaching a replica that does not run it, served by the one that does.

Runs live in the process that started them (their sandbox, queue and output), and a browser's
socket lands on any replica or `serve --workers` worker: before, the others closed it 4404 "run is
over; read it with GET", so with two workers a console followed about half the runs live. Now
they relay it to the run's server (its address from sandbox.server_presence). A cancel sent to
another replica used to answer the run as it was and cancel nothing; it is forwarded too.
"""

from __future__ import annotations

import logging

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from ide_server.ws_relay import CREDENTIALS, relay_to
from sandbox.frames import CLOSE_UNAVAILABLE

log = logging.getLogger(__name__)


async def serve_from(websocket: WebSocket, address: str) -> None:
    """Relay an accepted socket to the same path on the replica at `address` ("host:port"); closed
    CLOSE_UNAVAILABLE if that replica does not answer."""
    if not await relay_to(websocket, address):
        await websocket.close(CLOSE_UNAVAILABLE, "the server running this run does not answer")


async def forward_post(request: Request, address: str) -> JSONResponse:
    """The same POST (no body) on the replica at `address`, with the caller's credentials; its answer."""
    headers = {name: value for name in CREDENTIALS if (value := request.headers.get(name))}
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.post(f"http://{address}{request.url.path}", headers=headers)
    except httpx.HTTPError as exc:
        log.warning("could not reach the run's server at %s: %s", address, exc)
        return JSONResponse({"detail": "the server running this run does not answer; try again"}, status_code=503,
                            headers={"Retry-After": "2"})
    return JSONResponse(answer.json(), status_code=answer.status_code)
