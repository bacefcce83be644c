"""One client's y-websocket session, independent of the web framework.

The websocket handler authenticates, looks up the role, then hands three callables (send,
receive, close) to CollabConnection.serve(). Viewers get the document and may publish presence,
but their document updates are refused: not applied, not stored, not broadcast.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from collab.protocol import (
    AuthMessage,
    AwarenessUpdate,
    ProtocolError,
    QueryAwareness,
    SyncStep1,
    SyncStep2,
    SyncUpdate,
    decode_message,
)
from collab.room import Room, RoomKey
from collab.rooms import CLOSE_GONE, RoomManager

log = logging.getLogger(__name__)

CLOSE_PROTOCOL_ERROR = 4400
CLOSE_UNSUPPORTED_FILE = 4415
CLOSE_TOO_SLOW = 1013
CLOSE_SERVER_ERROR = 1011
# A client this many messages behind is dropped; it resyncs on reconnect.
MAX_QUEUED_MESSAGES = 10_000

Send = Callable[[bytes], Awaitable[None]]
Receive = Callable[[], Awaitable[bytes | None]]  # None once the client disconnected
Close = Callable[[int, str], Awaitable[None]]


class CollabConnection:
    def __init__(
        self,
        manager: RoomManager,
        key: RoomKey,
        *,
        send: Send,
        receive: Receive,
        close: Close,
        can_write: bool,
        user_id: str,
    ) -> None:
        self.manager = manager
        self.key = key
        self.can_write = can_write
        self.user_id = user_id
        self.awareness_ids: set[int] = set()
        self._send = send
        self._receive = receive
        self._close = close
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue(MAX_QUEUED_MESSAGES)
        self._closed = False

    async def serve(self) -> None:
        """Run the session until the client leaves or is closed."""
        try:
            room = await self.manager.acquire(self.key)
        except FileNotFoundError as exc:
            await self.close(CLOSE_GONE, str(exc))
            return
        except ValueError as exc:
            await self.close(CLOSE_UNSUPPORTED_FILE, str(exc))
            return
        except Exception:
            log.exception("opening room %s failed", self.key.name)
            await self.close(CLOSE_SERVER_ERROR, "could not open the file")
            return
        sender = asyncio.create_task(self._drain_outbox())
        try:
            room.join(self)
            while not self._closed:
                data = await self._receive()
                if data is None:
                    break
                await self._handle(room, data)
        except ProtocolError as exc:
            log.info("closing %s for %s: %s", self.user_id, self.key.name, exc)
            await self.close(CLOSE_PROTOCOL_ERROR, str(exc)[:120])
        finally:
            self._closed = True
            await room.leave(self)
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            await self.manager.release(room)

    def enqueue(self, message: bytes) -> None:
        if self._closed:
            return
        try:
            self._outbox.put_nowait(message)
        except asyncio.QueueFull:
            asyncio.create_task(self.close(CLOSE_TOO_SLOW, "client too far behind"))

    async def close(self, code: int, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._close(code, reason)
        except Exception:
            log.debug("close of an already closed socket", exc_info=True)

    async def _handle(self, room: Room, data: bytes) -> None:
        message = decode_message(data)
        match message:
            case SyncStep1(state_vector):
                self.enqueue(await room.sync_reply(state_vector))
            case SyncStep2(update) | SyncUpdate(update):
                if self.can_write:
                    room.receive_update(update, origin=self)
            case AwarenessUpdate(entries):
                await room.receive_awareness(entries, origin=self)
            case QueryAwareness():
                self.enqueue(room.presence_message())
            case AuthMessage():
                pass  # authentication happens before the session starts

    async def _drain_outbox(self) -> None:
        try:
            while True:
                await self._send(await self._outbox.get())
        except Exception:
            # The socket is gone; the receive side notices and ends the session.
            self._closed = True
