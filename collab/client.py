"""A y-websocket client on a pycrdt document, doing what the browser's provider does.

For the tools that edit files as users do over real sockets (the load test, the crash test, the
multi-machine stack test), so that they all speak the protocol the same, tested way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import websockets
from pycrdt import Doc, Text
from websockets.typing import Origin

from collab.protocol import (
    SyncStep1,
    SyncStep2,
    SyncUpdate,
    decode_message,
    encode_sync_step1,
    encode_sync_step2,
    encode_sync_update,
)


class CollabClient:
    """One editor on one file. Every (re)connection syncs both ways: it sends its state (step 1) and
    answers the room's step 1 with what the room lacks, so edits a server took down with it unstored
    are sent again, and what the client already holds is not duplicated."""

    def __init__(self) -> None:
        self.doc: Doc[Text] = Doc()
        self.text = self.doc.get("content", type=Text)
        self.socket: websockets.ClientConnection | None = None
        self.following: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()  # the room's state has arrived on the current socket
        self.changed = asyncio.Event()  # set on every update applied, and when the socket closes

    @property
    def closed(self) -> bool:
        """Whether the current socket has gone (or none was opened)."""
        return self.following is None or self.following.done()

    async def connect(self, url: str, headers: dict[str, str], origin: str | None = None) -> None:
        """Open `url` (`ws://…/ws/collab/<project>/<path>`) and start syncing; `synced` tells when the
        room's state is in."""
        socket = await websockets.connect(url, additional_headers=headers, max_size=None,
                                          origin=Origin(origin) if origin else None)
        self.socket = socket
        self.synced.clear()
        await socket.send(encode_sync_step1(self.doc.get_state()))
        self.following = asyncio.create_task(self._follow(socket))

    async def _follow(self, socket: websockets.ClientConnection) -> None:
        try:
            with contextlib.suppress(websockets.ConnectionClosed):
                async for raw in socket:
                    message = decode_message(raw if isinstance(raw, bytes) else raw.encode())
                    if isinstance(message, SyncStep1):
                        await socket.send(encode_sync_step2(self.doc.get_update(message.state_vector)))
                    elif isinstance(message, SyncStep2 | SyncUpdate):
                        self.doc.apply_update(message.update)
                        if isinstance(message, SyncStep2):
                            self.synced.set()
                        self.changed.set()
        finally:
            self.synced.set()
            self.changed.set()

    async def append(self, piece: str) -> None:
        """Type `piece` at the end, as keystrokes do: applied here, its update sent to the room."""
        if self.socket is None:
            raise RuntimeError("append before connect")
        before = self.doc.get_state()
        self.text.insert(len(self.text), piece)
        await self.socket.send(encode_sync_update(self.doc.get_update(before)))

    async def wait_for(self, reached: Callable[[str], bool], timeout: float) -> bool:
        """Whether the document's text satisfies `reached` within `timeout` seconds (False at once if
        the socket has gone)."""
        deadline = time.monotonic() + timeout
        while not reached(str(self.text)):
            remaining = deadline - time.monotonic()
            if self.closed or remaining <= 0:
                return False
            self.changed.clear()
            if reached(str(self.text)):
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    async def close(self) -> None:
        """Close the socket and wait for its reader to end."""
        if self.socket is not None:
            await self.socket.close()
        if self.following is not None:
            await self.following
