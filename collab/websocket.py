"""Starlette/FastAPI glue: run a collab session on an already accepted and authorised websocket."""

from __future__ import annotations

from starlette.websockets import WebSocket, WebSocketState

from collab.connection import CollabConnection
from collab.protocol import ProtocolError
from collab.room import RoomKey
from collab.rooms import RoomManager


async def serve_websocket(
    websocket: WebSocket, manager: RoomManager, key: RoomKey, *, can_write: bool, user_id: str
) -> None:
    async def receive() -> bytes | None:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return None
        if message.get("bytes") is None:
            raise ProtocolError("text frames are not part of the y-websocket protocol")
        data: bytes = message["bytes"]
        return data

    async def close(code: int, reason: str) -> None:
        if websocket.application_state == WebSocketState.CONNECTED:
            await websocket.close(code, reason)

    connection = CollabConnection(
        manager,
        key,
        send=websocket.send_bytes,
        receive=receive,
        close=close,
        can_write=can_write,
        user_id=user_id,
    )
    await connection.serve()
