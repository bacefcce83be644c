"""JSON frames of the run and shell WebSockets: reading client frames, sending output as text."""

from __future__ import annotations

import codecs
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from sandbox.backend import OutputChunk
from sandbox.run_queue import RunState

MAX_FRAME = 64 * 1024
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_BUSY = 4429
CLOSE_UNAVAILABLE = 4503
# What sending or receiving raises once the client has gone (or the socket broke).
SOCKET_GONE = (WebSocketDisconnect, RuntimeError, OSError)


async def receive_frame(websocket: WebSocket) -> dict[str, Any]:
    """The next client frame; ValueError (with the reason) for one that is not a JSON object with a type.

    Raises WebSocketDisconnect when the client has gone."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    if text is None:
        raise ValueError("frames must be JSON text, not binary")
    if len(text) > MAX_FRAME:
        raise ValueError(f"frame larger than {MAX_FRAME} characters")
    try:
        frame = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError("frames must be JSON objects") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise ValueError('frames must be JSON objects with a "type"')
    return frame


async def send_chunks(websocket: WebSocket, chunks: AsyncIterator[OutputChunk | RunState], frame_type: str | None = None) -> None:
    """Send output as {"type": stream (or frame_type), "data": text}; UTF-8 split across chunks stays whole.
    A run's state changes go as {"type": "status", "status", "queue_position", "waiting_for_input", "listening_port",
    "preview_url"}."""
    decoders: dict[str, codecs.IncrementalDecoder] = {}
    async for chunk in chunks:
        if isinstance(chunk, RunState):
            await websocket.send_json({"type": "status", **dataclasses.asdict(chunk)})
            continue
        decoder = decoders.setdefault(chunk.stream, codecs.getincrementaldecoder("utf-8")("replace"))
        if text := decoder.decode(chunk.data):
            await websocket.send_json({"type": frame_type or chunk.stream, "data": text})
